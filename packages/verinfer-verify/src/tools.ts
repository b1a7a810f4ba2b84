// Tool calling as the protocol reads it (verinfer.protocol.tools): the body's tools / tool_choice /
// parallel_tool_calls, the grammar spec of a forced call, and how a choice's output text reads as
// its message (content, tool_calls with their ids). Both sides must give the same bytes, so the
// JSON reading and writing here are Python's: json.loads (keys in order, a repeated key keeps
// its first place and its last value, ints exact, NaN/Infinity refused, at most 4300 digits an
// int) and canonical_json (compact, integral floats up to 2^53 as ints, repr's float spelling,
// only '"', '\\' and controls escaped). tests/vectors/exec_requests.json holds Python's answers
// (scripts/gen-client-vectors); test/tools.test.ts holds this file equal to them.
import { sha256 } from "@noble/hashes/sha2";
import { bytesToHex, hexToBytes, utf8ToBytes } from "@noble/hashes/utils";

/** A JSON value as Python's json.loads gives it: ints as bigint, floats as number, objects as
 * Maps (insertion order, as a Python dict). */
export type PyJson = null | boolean | bigint | number | string | PyJson[] | Map<string, PyJson>;

export class PyJsonError extends Error {}
/** What verinfer.protocol.tools raises for a body (InvalidRequestError, with its param). */
export class ToolRuleError extends Error {
  constructor(message: string, public readonly param: string) { super(message); }
}

export const MAX_TOOLS = 128; // verinfer.protocol.limits.MAX_TOOLS (the vector test holds it equal)
export const MAX_EXACT_FLOAT_INT = 2 ** 53;
export const CALL_ID_DOMAIN = "verinfer/tool-call-id/v1";
export const CALL_OPEN = "<tool_call>";
export const CALL_CLOSE = "</tool_call>";
const FUNCTION_NAME = /^[A-Za-z0-9_-]{1,64}$/;
const MAX_INT_DIGITS = 4300; // Python's int <-> str conversion limit (sys.int_info)
/** verinfer.protocol.tools.MAX_OUTPUT_DEPTH: the deepest JSON a call read from the output may be. */
export const MAX_OUTPUT_DEPTH = 64;

// ---- json.loads ----------------------------------------------------------------------------------
const WS = new Set([" ", "\t", "\n", "\r"]);
const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;

/** Python's ``json.loads(text)`` (strict; NaN and Infinity refused, as the rule's _loads).
 * ``output``: the rule's _loads_output, for a model's output: also refused when nested deeper
 * than MAX_OUTPUT_DEPTH, when a number overflows a double, or when a string (or key) holds a
 * lone surrogate (an escape such as "\\ud800"). */
export function pyLoads(text: string, output = false): PyJson {
  if (text.startsWith("\ufeff")) throw new PyJsonError("Unexpected UTF-8 BOM");
  let i = 0;
  let depth = 0;
  const enter = () => { if (output && ++depth > MAX_OUTPUT_DEPTH) fail(`nested deeper than ${MAX_OUTPUT_DEPTH}`); };
  const ws = () => { while (i < text.length && WS.has(text[i])) i++; };
  const fail = (what: string): never => { throw new PyJsonError(`${what} at ${i}`); };
  const str = (): string => {
    i++; // the opening quote
    let out = "";
    for (;;) {
      if (i >= text.length) fail("unterminated string");
      const c = text[i];
      if (c === '"') {
        i++;
        if (output && LONE_SURROGATE.test(out)) fail("a string that is not valid Unicode");
        return out;
      }
      if (c === "\\") {
        const e = text[i + 1];
        const simple: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };
        if (e !== undefined && e in simple) { out += simple[e]; i += 2; continue; }
        if (e === "u") {
          const hex = text.slice(i + 2, i + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("invalid \\uXXXX escape");
          out += String.fromCharCode(parseInt(hex, 16)); // a pair joins as UTF-16, as Python joins it
          i += 6;
          continue;
        }
        fail("invalid escape");
      }
      if (c.charCodeAt(0) < 0x20) fail("invalid control character");
      out += c;
      i++;
    }
  };
  const value = (): PyJson => {
    const c = text[i];
    if (c === '"') return str();
    if (c === "{") {
      enter();
      i++;
      const obj = new Map<string, PyJson>();
      ws();
      if (text[i] === "}") { i++; depth--; return obj; }
      for (;;) {
        if (text[i] !== '"') fail("expecting property name");
        const k = str();
        ws();
        if (text[i] !== ":") fail("expecting ':'");
        i++;
        ws();
        obj.set(k, value()); // a repeated key: first place, last value (a Python dict)
        ws();
        if (text[i] === "}") { i++; depth--; return obj; }
        if (text[i] !== ",") fail("expecting ',' or '}'");
        i++;
        ws();
      }
    }
    if (c === "[") {
      enter();
      i++;
      const arr: PyJson[] = [];
      ws();
      if (text[i] === "]") { i++; depth--; return arr; }
      for (;;) {
        ws();
        arr.push(value());
        ws();
        if (text[i] === "]") { i++; depth--; return arr; }
        if (text[i] !== ",") fail("expecting ',' or ']'");
        i++;
      }
    }
    for (const [lit, v] of [["null", null], ["true", true], ["false", false]] as const) {
      if (text.startsWith(lit, i)) { i += lit.length; return v; }
    }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (m === null) fail("expecting value"); // NaN, Infinity, -Infinity included: not JSON here
    const num = m![0];
    i += num.length;
    if (m![1] === undefined && m![2] === undefined) {
      if (num.replace("-", "").length > MAX_INT_DIGITS) fail("an int of more than 4300 digits");
      return BigInt(num);
    }
    const x = Number(num);
    if (output && !Number.isFinite(x)) fail(`${num.slice(0, 40)} overflows a double`);
    return x;
  };
  ws();
  const v = value();
  ws();
  if (i !== text.length) fail("extra data");
  return v;
}

// ---- canonical_json --------------------------------------------------------------------------------
/** Python's ``repr(float)`` of a finite double. */
export function pyFloatRepr(x: number): string {
  if (Object.is(x, -0)) return "-0.0";
  if (x === 0) return "0.0";
  const sign = x < 0 ? "-" : "";
  const [mant, exp] = Math.abs(x).toExponential().split("e"); // shortest round-trip digits
  const digits = mant.replace(".", "");
  const e = Number(exp);
  const decpt = e + 1;
  if (decpt <= -4 || decpt > 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${m}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  }
  if (decpt <= 0) return `${sign}0.${"0".repeat(-decpt)}${digits}`;
  if (decpt < digits.length) return `${sign}${digits.slice(0, decpt)}.${digits.slice(decpt)}`;
  return `${sign}${digits}${"0".repeat(decpt - digits.length)}.0`;
}

function pyStr(s: string): string {
  let out = '"';
  for (const ch of s) { // (lone surrogates pass as they are: Python writes them unescaped too)
    const c = ch.charCodeAt(0);
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch === "\b") out += "\\b";
    else if (ch === "\f") out += "\\f";
    else if (c < 0x20) out += `\\u${c.toString(16).padStart(4, "0")}`;
    else out += ch;
  }
  return out + '"';
}

/** verinfer.protocol.grammar.canonical_json: compact, keys in order, numbers canonical. */
export function canonicalJson(v: PyJson): string {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new ToolRuleError("the schema holds a non-finite number", "response_format");
    if (Number.isInteger(v) && Math.abs(v) <= MAX_EXACT_FLOAT_INT) return BigInt(v).toString();
    return pyFloatRepr(v + 0);
  }
  if (typeof v === "string") return pyStr(v);
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  return `{${[...v].map(([k, x]) => `${pyStr(k)}:${canonicalJson(x)}`).join(",")}}`;
}

// ---- the body's tool options (tool_policy) --------------------------------------------------------
export interface ToolFunction { name: string; description: string | null; parameters: string }
export interface ToolPolicy {
  tools: ToolFunction[];
  choice: "none" | "auto" | "required" | "function";
  name: string | null;
  parallel: boolean;
}

const isMap = (v: PyJson | undefined): v is Map<string, PyJson> => v instanceof Map;
const keysAre = (m: Map<string, PyJson>, ...ks: string[]) =>
  m.size === ks.length && ks.every((k) => m.has(k));
const err = (msg: string, param: string) => new ToolRuleError(msg, param);

function functionName(v: PyJson | undefined, param: string): string {
  if (typeof v !== "string" || !FUNCTION_NAME.test(v)) {
    throw err("a function name has 1 to 64 letters, digits, '_' or '-'", param);
  }
  return v;
}

function allKeys(v: PyJson, out = new Set<string>()): Set<string> {
  if (isMap(v)) for (const [k, x] of v) { out.add(k); allKeys(x, out); }
  else if (Array.isArray(v)) for (const x of v) allKeys(x, out);
  return out;
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

function checkText(v: PyJson, param: string): void {
  if (typeof v === "string") {
    if (LONE_SURROGATE.test(v)) throw err(`${param} holds a string that is not valid Unicode`, param);
  } else if (isMap(v)) {
    for (const [k, x] of v) { checkText(k, param); checkText(x, param); }
  } else if (Array.isArray(v)) v.forEach((x) => checkText(x, param));
}

function tool(v: PyJson): ToolFunction {
  if (!isMap(v) || v.get("type") !== "function" || !keysAre(v, "type", "function")) {
    throw err("each tool is {\"type\": \"function\", \"function\": {...}} (only function tools are supported)", "tools");
  }
  const raw = v.get("function");
  if (!isMap(raw)) throw err("tools[].function must be an object", "tools");
  const fn = new Map([...raw].filter(([, x]) => x !== null));
  const extra = [...fn.keys()].filter((k) => !["name", "description", "parameters", "strict"].includes(k)).sort();
  if (extra.length) throw err(`tools[].function does not take '${extra[0]}'`, "tools");
  const name = functionName(fn.get("name"), "tools");
  const desc = fn.get("description");
  if (desc !== undefined && typeof desc !== "string") throw err("tools[].function.description must be a string", "tools");
  if (fn.has("strict") && typeof fn.get("strict") !== "boolean") throw err("tools[].function.strict must be a boolean", "tools");
  const params = fn.has("parameters") ? fn.get("parameters")! : new Map<string, PyJson>([["type", "object"], ["properties", new Map()]]);
  if (!isMap(params)) throw err("tools[].function.parameters must be a JSON schema object", "tools");
  checkText(params, "tools");
  if (allKeys(params).has("x-guidance")) {
    throw err("a tool's parameters may not set x-guidance (the rule fixes the grammar engine's options)", "tools");
  }
  if (desc !== undefined) checkText(desc, "tools");
  return { name, description: desc === undefined ? null : (desc as string), parameters: canonicalJson(params) };
}

/** verinfer.protocol.tools.tool_policy of a body (parsed by pyLoads); null: no tools. Top-level
 * nulls are omitted fields, as the request rule reads them. Throws ToolRuleError where an honest
 * server refuses the body. */
export function toolPolicy(bodyIn: Map<string, PyJson>): ToolPolicy | null {
  const body = new Map([...bodyIn].filter(([, v]) => v !== null));
  for (const [legacy, now] of [["functions", "tools"], ["function_call", "tool_choice"]]) {
    if (body.has(legacy)) throw err(`${legacy} is deprecated and not supported by this server; send ${now} instead`, legacy);
  }
  let parallel = true;
  if (body.has("parallel_tool_calls")) {
    const p = body.get("parallel_tool_calls");
    if (typeof p !== "boolean") throw err("parallel_tool_calls must be a boolean", "parallel_tool_calls");
    parallel = p;
  }
  const toolsIn = body.get("tools");
  if (toolsIn === undefined) {
    const choice = body.get("tool_choice");
    if (choice !== undefined && choice !== "none") throw err("tool_choice needs tools", "tool_choice");
    return null;
  }
  if (!Array.isArray(toolsIn) || toolsIn.length < 1 || toolsIn.length > MAX_TOOLS) {
    throw err(`tools must be an array of 1 to ${MAX_TOOLS} tools`, "tools");
  }
  const tools = toolsIn.map(tool);
  const names = tools.map((t) => t.name);
  if (new Set(names).size !== names.length) throw err("tool names must be unique", "tools");
  const choice = body.has("tool_choice") ? body.get("tool_choice")! : "auto";
  if (typeof choice === "string") {
    if (!["none", "auto", "required"].includes(choice)) {
      throw err("tool_choice must be 'none', 'auto', 'required' or a named function", "tool_choice");
    }
    return { tools, choice: choice as ToolPolicy["choice"], name: null, parallel };
  }
  const fn = isMap(choice) ? choice.get("function") : undefined;
  if (!isMap(choice) || choice.get("type") !== "function" || !keysAre(choice, "type", "function")
      || !isMap(fn) || !keysAre(fn, "name")) {
    throw err("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
  }
  const name = functionName(fn.get("name"), "tool_choice");
  if (!names.includes(name)) throw err(`tool_choice names '${name}', which is not among the tools`, "tool_choice");
  return { tools, choice: "function", name, parallel };
}

/** verinfer.protocol.tools.grammar_spec: the canonical json_schema spec of a forced call. */
export function grammarSpec(p: ToolPolicy | null): string | null {
  if (p === null || (p.choice !== "required" && p.choice !== "function")) return null;
  const schemaOf = (t: ToolFunction) => pyLoads(t.parameters);
  if (p.choice === "function") {
    const fn = p.tools.find((t) => t.name === p.name)!;
    return canonicalJson(new Map<string, PyJson>([["type", "json_schema"], ["schema", schemaOf(fn)]]));
  }
  const items: PyJson[] = p.tools.map((t) => new Map<string, PyJson>([
    ["type", "object"],
    ["properties", new Map<string, PyJson>([["name", new Map([["const", t.name]])], ["arguments", schemaOf(t)]])],
    ["required", ["name", "arguments"]], ["additionalProperties", false]]));
  const schema = new Map<string, PyJson>([["type", "array"], ["minItems", 1n]]);
  if (!p.parallel) schema.set("maxItems", 1n);
  schema.set("items", items.length === 1 ? items[0] : new Map([["anyOf", items]]));
  return canonicalJson(new Map<string, PyJson>([["type", "json_schema"], ["schema", schema]]));
}

// ---- reading the output (read_output, choice_message) --------------------------------------------
export interface ParsedCall { name: string; arguments: string }
export interface ToolCall { id: string; type: "function"; function: { name: string; arguments: string } }

// Python's str.isspace(): what str.strip / lstrip remove
const PY_SPACE = new Set([0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680,
  0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028,
  0x2029, 0x202f, 0x205f, 0x3000]);
function pyLstrip(s: string): string {
  let i = 0;
  while (i < s.length && PY_SPACE.has(s.charCodeAt(i))) i++;
  return s.slice(i);
}

function loadsOrNull(text: string): { v: PyJson } | null {
  try { return { v: pyLoads(text, true) }; } catch (e) {
    if (e instanceof PyJsonError) return null;
    throw e;
  }
}

/** ``_calls``: items as calls; [] if any is not ``{"name": declared, "arguments": {...}}`` (a
 * name that is a list or an object too: content, as in Python since it stopped raising). */
function calls(items: PyJson, names: Set<string>): ParsedCall[] {
  if (!Array.isArray(items) || items.length === 0) return [];
  const out: ParsedCall[] = [];
  for (const it of items) {
    if (!isMap(it) || !keysAre(it, "name", "arguments")) return [];
    const name = it.get("name")!;
    if (typeof name !== "string" || !names.has(name) || !isMap(it.get("arguments"))) return [];
    out.push({ name, arguments: canonicalJson(it.get("arguments")!) });
  }
  return out;
}

/** verinfer.protocol.tools.read_output: a choice's content and calls from its output text. */
export function readOutput(p: ToolPolicy | null, text: string): { content: string | null; calls: ParsedCall[] } {
  const plain = { content: text, calls: [] as ParsedCall[] };
  if (p === null || p.choice === "none") return plain;
  if (p.choice === "function") {
    const args = loadsOrNull(text);
    if (args === null) return plain; // cut short (max_tokens): not a call
    return { content: null, calls: [{ name: p.name!, arguments: canonicalJson(args.v) }] };
  }
  const names = new Set(p.tools.map((t) => t.name));
  if (p.choice === "required") {
    const items = loadsOrNull(text);
    if (items === null) return plain;
    const cs = calls(items.v, names);
    return cs.length ? { content: null, calls: cs } : plain;
  }
  const at = text.indexOf(CALL_OPEN);
  if (at < 0) return plain;
  const blocks: PyJson[] = [];
  let pos = at;
  for (;;) {
    const rest = text.slice(pos);
    const stripped = pyLstrip(rest);
    if (!stripped) break;
    if (!stripped.startsWith(CALL_OPEN)) return plain;
    const start = rest.length - stripped.length + CALL_OPEN.length;
    const end = rest.indexOf(CALL_CLOSE, start);
    if (end < 0) return plain;
    const block = loadsOrNull(rest.slice(start, end));
    if (block === null) return plain;
    blocks.push(block.v);
    pos += end + CALL_CLOSE.length;
  }
  let cs = calls(blocks, names);
  if (!cs.length) return plain;
  if (!p.parallel) cs = cs.slice(0, 1);
  const head = text.slice(0, at);
  return { content: pyLstrip(head) ? head : null, calls: cs };
}

/** verinfer.protocol.tools.call_id: ``call_`` + 24 hex of sha256(domain || reqHash || u32 index). */
export function callId(reqHash: string, index: number): string {
  const idx = new Uint8Array(4);
  new DataView(idx.buffer).setUint32(0, index, false);
  const h = hexToBytes(reqHash.replace(/^0x/, ""));
  const dom = utf8ToBytes(CALL_ID_DOMAIN);
  const buf = new Uint8Array(dom.length + h.length + 4);
  buf.set(dom, 0); buf.set(h, dom.length); buf.set(idx, dom.length + h.length);
  return `call_${bytesToHex(sha256(buf)).slice(0, 24)}`;
}

/** verinfer.protocol.tools.choice_message: the message's content and tool_calls (null: none). */
export function choiceMessage(p: ToolPolicy | null, text: string, reqHash: string):
  { content: string | null; toolCalls: ToolCall[] | null } {
  const out = readOutput(p, text);
  return { content: out.content, toolCalls: out.calls.length ? out.calls.map((c, i) => ({
    id: callId(reqHash, i), type: "function" as const, function: { name: c.name, arguments: c.arguments } })) : null };
}
