// Every check a JS app can run on a verinfer answer without the model's tokenizer (docs/client.md
// "JavaScript apps" lists them and what is left to the Python client). Check names are the
// Python client's (verinfer.client.verify).
import { getAddress, recoverTypedDataAddress, type Hex } from "viem";
import { execRequestHash, execResultHash, sha256Hex, choiceSeed, EXEC_VERSION } from "./canonical.js";
import { VerificationError } from "./errors.js";
import { parseJson, type Json } from "./json.js";
import { choiceMessage, grammarSpec, pyLoads, toolPolicy, ToolRuleError, type PyJson, type ToolPolicy }
  from "./tools.js";

/** The request rule's defaults (verinfer.protocol.limits; the vector test holds them equal). */
export const RULE = { DEFAULT_TEMPERATURE: 1.0, DEFAULT_TOP_P: 1.0, DEFAULT_N: 1 } as const;
export const DOMAIN_NAME = "verinfer";
export const DOMAIN_VERSION = "1";
export const MAX_ISSUED_AT_SKEW_S = 300;

/** The receipt's EIP-712 struct (verinfer.receipts.eip712), in struct order. */
export const RECEIPT_FIELDS = [
  { name: "version", type: "uint16" }, { name: "operator", type: "address" },
  { name: "chainId", type: "uint256" }, { name: "modelId", type: "bytes32" },
  { name: "engineFingerprintHash", type: "bytes32" }, { name: "reqHash", type: "bytes32" },
  { name: "outHash", type: "bytes32" }, { name: "keyEpoch", type: "uint64" },
  { name: "ciphertextHash", type: "bytes32" }, { name: "issuedAt", type: "uint64" },
] as const;
export const RECEIPT_TYPE =
  `Receipt(${RECEIPT_FIELDS.map((f) => `${f.type} ${f.name}`).join(",")})`;

const SECP256K1_HALF_N = 0x7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0n;

export interface Expected {
  /** The chain the app trusts (receipt and domain must name it). */
  chainId: number | bigint;
  /** The ChallengeManager address (the EIP-712 verifyingContract). */
  verifyingContract: string;
  /** Operators the app accepts; omitted: any, as long as the signature recovers the receipt's. */
  operators?: string[];
  /** Body model name → model id (0x + 64 hex); a body naming a model id is held to it anyway. */
  models?: Record<string, string>;
  /** Accepted engineFingerprintHash values (0x-hex); omitted: any. */
  fingerprints?: string[];
  /** issuedAt window around now (seconds); defaults 300 / 300. */
  maxSkewS?: number;
  maxAgeS?: number;
  /** Unix seconds; default Date.now() / 1000. */
  now?: () => number;
}

/** One ``message.tool_calls`` entry as received (a stream: its deltas joined per index). */
export interface ReceivedCall { id?: unknown; type?: unknown; name?: unknown; arguments?: unknown }

/** What the app received per choice (a stream: the deltas concatenated). ``text``: the message
 * content (null: none); ``outputText``: the choice's ``verinfer.output_text`` (the text the
 * receipt's text hash covers when the message is not the whole output: tool calls);
 * ``toolCalls``: the message's calls; ``functionCall`` / ``refusal``: what the message carried
 * in those fields (an honest answer: nothing). */
export interface Received {
  text: string | null;
  finishReason?: string | null;
  outputText?: string | null;
  toolCalls?: ReceivedCall[] | null;
  functionCall?: unknown;
  refusal?: unknown;
}

export interface Checked {
  choice: number;
  receiptId: string | null;
  operator: string;
  reqHash: string;
  outHash: string;
  issuedAt: bigint;
  execRequest: Json;
}

type Obj = Record<string, Json>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const big = (v: Json | undefined): bigint | null =>
  typeof v === "number" && Number.isInteger(v) ? BigInt(v) : typeof v === "bigint" ? v : null;

function asJson(v: string | object): Json {
  return typeof v === "string" ? parseJson(v) : (v as Json);
}

/** The endpoint a body is for: chat (messages), completions (prompt) or responses (input). */
export function endpointOf(body: Obj): "chat" | "completions" | "responses" {
  if ("messages" in body) return "chat";
  if ("prompt" in body) return "completions";
  if ("input" in body) return "responses";
  throw new VerificationError("request", "the body has no messages, prompt or input");
}

/** Text, finish reason and (chat) tool calls and output text per choice, from a
 * chat/completions/responses JSON response. */
export function receivedOf(response: Obj): Received[] {
  if (Array.isArray(response.choices)) {
    return response.choices.map((c) => {
      const ch = isObj(c) ? c : {};
      const msg = isObj(ch.message) ? ch.message : null;
      const text = msg ? msg.content : ch.text;
      const ev = isObj(ch.verinfer) ? ch.verinfer : {};
      const calls = msg && Array.isArray(msg.tool_calls) ? msg.tool_calls.map((tc): ReceivedCall => {
        const t = isObj(tc) ? tc : {};
        const fn = isObj(t.function) ? t.function : {};
        return { id: t.id, type: t.type, name: fn.name, arguments: fn.arguments };
      }) : null;
      return { text: typeof text === "string" ? text : msg ? null : "",
        finishReason: typeof ch.finish_reason === "string" ? ch.finish_reason : null,
        outputText: typeof ev.output_text === "string" ? ev.output_text : null,
        toolCalls: calls, functionCall: msg?.function_call ?? null, refusal: msg?.refusal ?? null };
    });
  }
  if (Array.isArray(response.output)) { // Responses API: the output_text parts, in order
    let text = "";
    for (const item of response.output) {
      if (!isObj(item) || !Array.isArray(item.content)) continue;
      for (const part of item.content) {
        if (isObj(part) && part.type === "output_text" && typeof part.text === "string") text += part.text;
      }
    }
    return [{ text, finishReason: null }];
  }
  throw new VerificationError("format", "the response has neither choices nor output");
}

/**
 * Verifies a response against the body this app sent. ``requestBody`` and ``response`` should be
 * the raw JSON text (a u64 seed survives only that way; an already parsed object works when every
 * integer is below 2^53). ``received`` overrides what is read from the response (a stream's text).
 * Returns the checked choices or throws VerificationError naming the first failed check.
 */
export async function verifyResponse(requestBody: string | object, response: string | object,
  expected: Expected, received?: Received[]): Promise<Checked[]> {
  const body = asJson(requestBody);
  const resp = asJson(response);
  if (!isObj(body)) throw new VerificationError("request", "the request body is not a JSON object");
  if (!isObj(resp)) throw new VerificationError("format", "the response is not a JSON object");
  const v = resp.verification;
  if (!isObj(v)) throw new VerificationError("format", "the response carries no verification object");
  const entries = Array.isArray(v.choices) ? v.choices : [v];
  const got = received ?? receivedOf(resp);
  if (entries.length !== got.length || got.length === 0) {
    throw new VerificationError("choices", `${got.length} choices received, ${entries.length} verified`);
  }
  const endpoint = endpointOf(body);
  const tools = endpoint === "chat" ? policyOf(requestBody) : null;
  const n = body.n === undefined ? RULE.DEFAULT_N : body.n;
  if (endpoint !== "responses" && typeof n === "number" && n !== got.length) {
    throw new VerificationError("choices", `the body asked for n=${n}, ${got.length} received`);
  }
  const out: Checked[] = [];
  for (let k = 0; k < entries.length; k++) {
    out.push(await verifyChoice(k, entries[k], body, endpoint, got[k], expected, tools));
  }
  return out;
}

/** The body's tool options as the request rule reads them (keys in the body's order when the
 * body is given as text). */
function policyOf(requestBody: string | object): ToolPolicy | null {
  let b: PyJson;
  try {
    b = typeof requestBody === "string" ? pyLoads(requestBody) : toPy(requestBody as Json);
  } catch { throw new VerificationError("request", "the request body is not JSON"); }
  if (!(b instanceof Map)) throw new VerificationError("request", "the request body is not a JSON object");
  try {
    return toolPolicy(b);
  } catch (e) {
    if (e instanceof ToolRuleError) {
      throw new VerificationError("request", `an honest server refuses the body this app sent (${e.param}: ${e.message})`);
    }
    throw e;
  }
}

/** A parsed JSON value as pyLoads gives it (an integral number: an int). */
function toPy(v: Json): PyJson {
  if (typeof v === "number") return Number.isInteger(v) ? BigInt(v) : v;
  if (Array.isArray(v)) return v.map(toPy);
  if (isObj(v)) return new Map(Object.entries(v).map(([k, x]) => [k, toPy(x)]));
  return v as PyJson;
}

async function verifyChoice(k: number, e: Json, body: Obj, endpoint: string, got: Received,
  x: Expected, tools: ToolPolicy | null): Promise<Checked> {
  const fail = (check: string, msg: string) => new VerificationError(check, msg, k);
  if (!isObj(e) || !isObj(e.receipt) || !isObj(e.receipt.domain) || !isObj(e.receipt.message)
      || typeof e.signature !== "string" || !isObj(e.exec_request) || !isObj(e.exec_result)) {
    throw fail("format", "the verification entry lacks receipt, signature, exec_request or exec_result");
  }
  const d = e.receipt.domain, m = e.receipt.message;
  for (const f of RECEIPT_FIELDS) if (!(f.name in m)) throw fail("format", `the receipt lacks ${f.name}`);
  if (Object.keys(m).length !== RECEIPT_FIELDS.length) throw fail("format", "the receipt has unknown fields");
  if (d.name !== DOMAIN_NAME || d.version !== DOMAIN_VERSION) throw fail("format", "not a verinfer v1 EIP-712 domain");
  // chain_id, contract
  const want = BigInt(x.chainId);
  if (big(d.chainId) !== want || big(m.chainId) !== want) {
    throw fail("chain_id", `receipt chainId ${String(m.chainId)}, domain chainId ${String(d.chainId)}; expected ${want}`);
  }
  let contract: string, operator: string;
  try {
    contract = getAddress(String(d.verifyingContract));
    operator = getAddress(String(m.operator)) as string;
  } catch { throw fail("format", "a receipt address is not a valid address"); }
  if (contract !== getAddress(x.verifyingContract)) {
    throw fail("contract", `signed for contract ${contract}, not ${getAddress(x.verifyingContract)}`);
  }
  // signature: 65 bytes, v 27/28, low s (as the Python client and the contracts require)
  const sig = e.signature;
  if (!/^0x[0-9a-fA-F]{130}$/.test(sig)) throw fail("signature", "the signature is not 65 bytes of hex");
  const s = BigInt(`0x${sig.slice(66, 130)}`), vb = parseInt(sig.slice(130, 132), 16);
  if ((vb !== 27 && vb !== 28) || s > SECP256K1_HALF_N || s === 0n) {
    throw fail("signature", "the signature is not canonical (v 27/28, low s)");
  }
  let message: Record<string, unknown>;
  try {
    message = Object.fromEntries(RECEIPT_FIELDS.map((f) => {
      const val = m[f.name];
      if (f.type.startsWith("uint")) {
        const b = big(val);
        if (b === null || b < 0n || b >= 2n ** BigInt(f.type.slice(4))) throw new Error(f.name);
        return [f.name, b];
      }
      if (f.type === "bytes32" && !(typeof val === "string" && /^0x[0-9a-fA-F]{64}$/.test(val))) throw new Error(f.name);
      return [f.name, f.type === "address" ? operator : val];
    }));
  } catch (err) { throw fail("format", `receipt field ${(err as Error).message} is malformed`); }
  let signer: string;
  try {
    signer = await recoverTypedDataAddress({
      domain: { name: DOMAIN_NAME, version: DOMAIN_VERSION, chainId: want, verifyingContract: contract as Hex },
      types: { Receipt: RECEIPT_FIELDS.map((f) => ({ ...f })) },
      primaryType: "Receipt", message: message as never, signature: sig as Hex,
    });
  } catch (err) { throw fail("signature", `no signer recovers: ${(err as Error).message.split("\n")[0]}`); }
  if (signer !== operator) throw fail("signature", `the signature recovers ${signer}, not the receipt's operator ${operator}`);
  // operator
  if (x.operators && !x.operators.map((a) => getAddress(a) as string).includes(operator)) {
    throw fail("operator", `${operator} is not an operator this app accepts`);
  }
  // issued_at
  const now = Math.floor((x.now ?? (() => Date.now() / 1000))());
  const at = message.issuedAt as bigint;
  if (at > BigInt(now + (x.maxSkewS ?? MAX_ISSUED_AT_SKEW_S)) || at < BigInt(now - (x.maxAgeS ?? MAX_ISSUED_AT_SKEW_S))) {
    throw fail("issued_at", `issuedAt ${at} is outside the window around now (${now})`);
  }
  const req = e.exec_request, res = e.exec_result;
  // model
  if (String(req.model_id).toLowerCase() !== String(m.modelId).toLowerCase()) {
    throw fail("model", "the ExecRequest's model_id is not the receipt's modelId");
  }
  const name = body.model;
  const named = typeof name === "string" && /^0x[0-9a-fA-F]{64}$/.test(name) ? name
    : typeof name === "string" && x.models ? x.models[name] : undefined;
  if (x.models && typeof name === "string" && named === undefined) {
    throw fail("model", `the body's model ${JSON.stringify(name)} is not one this app accepts`);
  }
  if (named !== undefined && named.toLowerCase() !== String(m.modelId).toLowerCase()) {
    throw fail("model", `the body asked for ${JSON.stringify(name)} (${named}); the answer is signed for ${String(m.modelId)}`);
  }
  // fingerprint
  if (typeof req.engine_fingerprint !== "string" || sha256Hex(req.engine_fingerprint) !== String(m.engineFingerprintHash).toLowerCase()) {
    throw fail("fingerprint", "the ExecRequest's engine fingerprint does not hash to the receipt's engineFingerprintHash");
  }
  if (x.fingerprints && !x.fingerprints.map((f) => f.toLowerCase()).includes(String(m.engineFingerprintHash).toLowerCase())) {
    throw fail("fingerprint", "the engine fingerprint is not one this app accepts");
  }
  // request: the ExecRequest given hashes to reqHash, and holds what the body asked for
  if (execRequestHash(req) !== String(m.reqHash).toLowerCase()) {
    throw fail("request", "the exec_request given does not hash to the receipt's reqHash");
  }
  checkBodyFields(body, endpoint, k, req, fail, tools);
  // output
  if (execResultHash(res) !== String(m.outHash).toLowerCase()) {
    throw fail("output", "the exec_result given does not hash to the receipt's outHash");
  }
  // output_text stands for the text only in a chat answer (checkMessage holds the message to it);
  // a completion's text is always the text checked
  const byOutputText = endpoint === "chat" && got.outputText != null;
  const text = byOutputText ? got.outputText! : got.text ?? "";
  if (sha256Hex(text) !== String(res.text_sha256).toLowerCase()) {
    throw fail("output", `the ${byOutputText ? "output_text" : "text"} received does not hash to the signed text hash`);
  }
  let finish = String(res.finish_reason);
  if (endpoint === "chat") finish = checkMessage(tools, text, String(m.reqHash), got, finish, fail);
  if (got.finishReason != null && got.finishReason !== finish) {
    throw fail("output", `finish_reason ${got.finishReason} received; the signed ${String(res.finish_reason)} answer is served as ${finish}`);
  }
  return { choice: k, receiptId: typeof e.receipt_id === "string" ? e.receipt_id : null, operator,
    reqHash: String(m.reqHash), outHash: String(m.outHash), issuedAt: at, execRequest: req };
}

/** The chat message received is the one the protocol's reading (tools.ts, Python's
 * verinfer.protocol.tools.choice_message) derives from the verified output text: its tool calls
 * (ids, names, arguments, order, count), then its content (null and empty alike). Returns the
 * finish reason an honest server writes: tool_calls exactly when there are calls. */
function checkMessage(tools: ToolPolicy | null, text: string, reqHash: string, got: Received,
  signed: string, fail: (check: string, msg: string) => VerificationError): string {
  let msg: ReturnType<typeof choiceMessage>;
  try { msg = choiceMessage(tools, text, reqHash); } catch (e) {
    throw fail("tool_calls", `an honest server cannot read the signed output text (${(e as Error).message})`);
  }
  if (got.functionCall != null) throw fail("tool_calls", "the message carries a legacy function_call, which an honest server never writes");
  const want = (msg.toolCalls ?? []).map((c) => [c.id, c.type, c.function.name, c.function.arguments]);
  const have = (got.toolCalls ?? []).map((c) => [c.id, c.type, c.name, c.arguments]);
  if (have.length !== want.length) {
    throw fail("tool_calls", `${have.length} tool call(s) received; the signed output text reads as ${want.length}`);
  }
  const fields = ["id", "type", "name", "arguments"];
  for (let i = 0; i < want.length; i++) {
    for (let j = 0; j < fields.length; j++) {
      if (have[i][j] !== want[i][j]) {
        throw fail("tool_calls", `tool call ${i}: ${fields[j]} ${JSON.stringify(have[i][j])} received; the signed output text reads as ${JSON.stringify(want[i][j])}`);
      }
    }
  }
  if (got.refusal != null) throw fail("content", "the message carries a refusal, which an honest server never writes");
  if ((got.text ?? "") !== (msg.content ?? "")) {
    throw fail("content", `the message content is not what the signed output text reads as${want.length ? " (with tool calls)" : ""}`);
  }
  return want.length ? "tool_calls" : signed;
}

function num(v: Json | undefined, dflt: number): number | undefined {
  if (v === undefined || v === null) return dflt;
  return typeof v === "number" ? v + 0 : undefined;
}

/** The body-level fields of the request rule (verinfer.protocol.request_rule.parse_body) that a
 * JS app can recompute without the tokenizer, compared with the signed ExecRequest. Not
 * recomputable here: prompt_token_ids (tokenizer, chat template), tokenizer_hash, the engine
 * fingerprint's choice, max_tokens when omitted (context length) and a seed derived from the
 * prompt ids (no body seed), the grammar's compiled hash. */
export function checkBodyFields(body: Obj, endpoint: string, k: number, req: Obj,
  fail: (check: string, msg: string) => VerificationError, tools?: ToolPolicy | null): void {
  const diff: string[] = [];
  const same = (field: string, want: unknown, have: unknown) => {
    if (want !== have) diff.push(`${field} (asked ${String(want)}, signed ${String(have)})`);
  };
  if (req.version !== EXEC_VERSION) diff.push("version");
  same("temperature", num(body.temperature, RULE.DEFAULT_TEMPERATURE), req.temperature);
  same("top_p", num(body.top_p, RULE.DEFAULT_TOP_P), req.top_p);
  same("top_k", body.top_k ?? 0, req.top_k);
  same("ignore_eos", false, req.ignore_eos);
  const stop = body.stop === undefined || body.stop === null ? [] : typeof body.stop === "string" ? [body.stop] : body.stop;
  same("stop", JSON.stringify(stop), JSON.stringify(req.stop));
  same("presence_penalty", num(body.presence_penalty, 0), req.presence_penalty ?? 0);
  same("frequency_penalty", num(body.frequency_penalty, 0), req.frequency_penalty ?? 0);
  const bias = isObj(body.logit_bias)
    ? Object.entries(body.logit_bias).filter(([, b]) => b !== 0).map(([t, b]) => [Number(t), b])
      .sort((a, b) => (a[0] as number) - (b[0] as number))
    : [];
  same("logit_bias", JSON.stringify(bias), JSON.stringify(req.logit_bias ?? []));
  same("prompt_commitments", typeof body.prompt_commitments === "string" ? body.prompt_commitments.toLowerCase() : null,
    typeof req.prompt_commitments === "string" ? req.prompt_commitments.toLowerCase() : null);
  if (endpoint === "chat") {
    const limit = body.max_completion_tokens ?? body.max_tokens;
    if (limit !== undefined && limit !== null) same("max_tokens", Number(limit), req.max_tokens);
    same("top_logprobs", body.logprobs === true ? (body.top_logprobs ?? 0) : null, req.top_logprobs);
    const rf = isObj(body.response_format) ? body.response_format : null;
    // a forced tool call (required, named) is grammar-constrained too (verinfer.protocol.tools)
    const forced = grammarSpec(tools === undefined ? policyOf(body) : tools);
    const wantsGrammar = (rf !== null && rf.type !== "text") || forced !== null;
    same("grammar", wantsGrammar, "grammar_spec" in req);
    if (forced !== null) same("grammar_spec", forced, req.grammar_spec);
    if (rf && rf.type === "json_object") same("grammar_spec", '{"type":"json_object"}', req.grammar_spec);
    if (rf && rf.type === "json_schema" && typeof req.grammar_spec === "string") {
      const js = isObj(rf.json_schema) ? rf.json_schema : {};
      const signed = parseJson(req.grammar_spec);
      // grammar.response_format_spec: {"type": "json_schema", "schema": ...}, key order kept
      same("grammar_spec", canon({ type: "json_schema", schema: js.schema ?? {} }), canon(signed));
    }
  } else if (endpoint === "completions") {
    if (body.max_tokens !== undefined && body.max_tokens !== null) same("max_tokens", Number(body.max_tokens), req.max_tokens);
    same("top_logprobs", body.logprobs ?? null, req.top_logprobs);
  }
  if (body.seed !== undefined && body.seed !== null) {
    const seed = big(body.seed);
    const signed = big(req.seed);
    if (seed === null || signed === null || choiceSeed(seed, k) !== signed) {
      diff.push(`seed (body seed ${String(body.seed)} gives ${seed === null ? "?" : choiceSeed(seed, k)} for choice ${k}, signed ${String(req.seed)})`);
    }
  }
  if (diff.length) throw fail("request", `the signed ExecRequest differs from the body sent in ${diff.join(", ")}`);
}

/** Key order kept (a schema's property order is part of its grammar), numbers as numbers. */
function canon(v: Json): string {
  return JSON.stringify(v, (_k, val) => (typeof val === "bigint" ? val.toString() : val));
}
