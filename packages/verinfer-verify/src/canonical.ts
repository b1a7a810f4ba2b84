// The canonical ExecRequest / ExecResult encoding (verinfer.protocol.exec_request, the one home):
// RFC 8949 core deterministic CBOR of one map whose keys are the field names, floats in their
// shortest exact width, 32-byte hashes as byte strings, absent optionals null; the extended
// keys (sampler, penalties, logit_bias, grammar_*) only when not neutral. The JSON view the
// operator returns is decoded against the schema here (JSON cannot say 1.0 from 1), encoded
// (the structure below, each float's shortest width by cborg) and hashed with sha256 (req_hash /
// out_hash). Equality with Python is tested on tests/vectors/exec_requests.json (ExecRequests and
// ExecResults made by the Python codec).
import { encode, Token, Type } from "cborg";
import { sha256 } from "@noble/hashes/sha2";
import { bytesToHex, hexToBytes } from "@noble/hashes/utils";
import type { Json } from "./json.js";
import { VerificationError } from "./errors.js";

export const EXEC_VERSION = 2;
export const EXTENDED_SAMPLER = "vi-sample-v3";

/** A float-typed CBOR value (JSON's 1.0 arrives as the number 1). */
class F { constructor(readonly v: number) {} }

const U32 = 2n ** 32n;
const U64 = 2n ** 64n;

function fail(msg: string): never { throw new VerificationError("format", msg); }

function isObj(v: unknown): v is Record<string, Json> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
function uint(v: Json | undefined, bound: bigint, name: string): number | bigint {
  if ((typeof v !== "number" || !Number.isInteger(v)) && typeof v !== "bigint") {
    fail(`${name} must be an integer`);
  }
  const b = BigInt(v);
  if (b < 0n || b >= bound) fail(`${name} out of range`);
  return v;
}
/** ``normalize``: -0.0 → 0.0, as the Python ExecRequest does for temperature and penalties
 * (a logprob keeps its sign: the ExecResult does not normalize it). */
function float(v: Json | undefined, name: string, normalize = true): F {
  if (typeof v !== "number" || !Number.isFinite(v)) fail(`${name} must be a finite number`);
  return new F(normalize ? v + 0 : v);
}
function str(v: Json | undefined, name: string): string {
  if (typeof v !== "string") fail(`${name} must be a string`);
  return v;
}
function b32(v: Json | undefined, name: string): Uint8Array {
  if (typeof v !== "string" || !/^0x[0-9a-fA-F]{64}$/.test(v)) fail(`${name} must be 0x + 64 hex`);
  return hexToBytes(v.slice(2));
}
function b32OrNull(v: Json | undefined, name: string): Uint8Array | null {
  return v === null ? null : b32(v, name);
}
function list(v: Json | undefined, name: string): Json[] {
  if (!Array.isArray(v)) fail(`${name} must be a list`);
  return v;
}
function keys(m: Record<string, Json>, required: string[], optional: string[], what: string) {
  for (const k of required) if (!(k in m)) fail(`${what} lacks ${k}`);
  for (const k of Object.keys(m)) {
    if (!required.includes(k) && !optional.includes(k)) fail(`${what} has an unknown key ${k}`);
  }
}

const REQ_KEYS = ["version", "model_id", "tokenizer_hash", "engine_fingerprint",
  "prompt_token_ids", "max_tokens", "temperature", "top_k", "top_p", "stop", "seed",
  "ignore_eos", "prompt_commitments", "top_logprobs"];
const REQ_OPTIONAL = ["sampler", "presence_penalty", "frequency_penalty", "logit_bias",
  "grammar_spec", "grammar_engine", "grammar_hash"];

/** The ExecRequest's JSON view (``verification.exec_request``) → the map that is encoded. */
function execRequestMap(j: Json): Map<string, unknown> {
  if (!isObj(j)) fail("exec_request must be an object");
  keys(j, REQ_KEYS, REQ_OPTIONAL, "exec_request");
  if (j.version !== EXEC_VERSION) fail(`exec_request version ${String(j.version)} is not ${EXEC_VERSION}`);
  const m = new Map<string, unknown>();
  m.set("version", EXEC_VERSION);
  m.set("model_id", b32(j.model_id, "model_id"));
  m.set("tokenizer_hash", b32(j.tokenizer_hash, "tokenizer_hash"));
  m.set("engine_fingerprint", str(j.engine_fingerprint, "engine_fingerprint"));
  m.set("prompt_token_ids", list(j.prompt_token_ids, "prompt_token_ids")
    .map((t) => uint(t, U32, "prompt token id")));
  m.set("max_tokens", uint(j.max_tokens, U32, "max_tokens"));
  m.set("temperature", float(j.temperature, "temperature"));
  m.set("top_k", uint(j.top_k, U32, "top_k"));
  m.set("top_p", float(j.top_p, "top_p"));
  m.set("stop", list(j.stop, "stop").map((s) => str(s, "stop")));
  m.set("seed", uint(j.seed, U64, "seed"));
  if (typeof j.ignore_eos !== "boolean") fail("ignore_eos must be a boolean");
  m.set("ignore_eos", j.ignore_eos);
  m.set("prompt_commitments", b32OrNull(j.prompt_commitments, "prompt_commitments"));
  m.set("top_logprobs", j.top_logprobs === null ? null : uint(j.top_logprobs, 21n, "top_logprobs"));
  const extended = ["presence_penalty", "frequency_penalty", "logit_bias", "grammar_spec"]
    .some((k) => k in j);
  if (extended !== ("sampler" in j) || (extended && j.sampler !== EXTENDED_SAMPLER)) {
    fail(`sampler must be ${EXTENDED_SAMPLER} exactly when a vi-sample-v3 field is present`);
  }
  if (extended) m.set("sampler", EXTENDED_SAMPLER);
  for (const k of ["presence_penalty", "frequency_penalty"]) {
    if (k in j) {
      const f = float(j[k], k);
      if (f.v === 0) fail(`${k} is written only when non-zero`);
      m.set(k, f);
    }
  }
  if ("logit_bias" in j) {
    const pairs = list(j.logit_bias, "logit_bias");
    if (pairs.length === 0) fail("logit_bias is written only when non-empty");
    m.set("logit_bias", pairs.map((p) => {
      const pair = list(p, "logit_bias pair");
      if (pair.length !== 2) fail("logit_bias pairs are [id, bias]");
      return [uint(pair[0], U32, "logit_bias id"), float(pair[1], "logit_bias value")];
    }));
  }
  const g = ["grammar_spec", "grammar_engine", "grammar_hash"].filter((k) => k in j);
  if (g.length !== 0 && g.length !== 3) fail("grammar_spec, grammar_engine, grammar_hash come together");
  if (g.length === 3) {
    m.set("grammar_spec", str(j.grammar_spec, "grammar_spec"));
    m.set("grammar_engine", str(j.grammar_engine, "grammar_engine"));
    m.set("grammar_hash", b32(j.grammar_hash, "grammar_hash"));
  }
  return m;
}

const RES_KEYS = ["version", "output_token_ids", "finish_reason", "logit_digest", "text_sha256",
  "logprobs"];

function execResultMap(j: Json): Map<string, unknown> {
  if (!isObj(j)) fail("exec_result must be an object");
  keys(j, RES_KEYS, [], "exec_result");
  if (j.version !== EXEC_VERSION) fail(`exec_result version ${String(j.version)} is not ${EXEC_VERSION}`);
  if (j.finish_reason !== "stop" && j.finish_reason !== "length") fail("finish_reason must be stop or length");
  const m = new Map<string, unknown>();
  m.set("version", EXEC_VERSION);
  m.set("output_token_ids", list(j.output_token_ids, "output_token_ids")
    .map((t) => uint(t, U32, "output token id")));
  m.set("finish_reason", j.finish_reason);
  m.set("logit_digest", b32(j.logit_digest, "logit_digest"));
  m.set("text_sha256", b32(j.text_sha256, "text_sha256"));
  m.set("logprobs", j.logprobs === null ? null : list(j.logprobs, "logprobs").map((e) => {
    const entry = list(e, "logprobs entry");
    if (entry.length !== 2) fail("a logprobs entry is [logprob, top]");
    return [float(entry[0], "logprob", false), list(entry[1], "top").map((p) => {
      const pair = list(p, "top pair");
      if (pair.length !== 2) fail("a top pair is [id, logprob]");
      return [uint(pair[0], U32, "top id"), float(pair[1], "top logprob", false)];
    })];
  }));
  return m;
}

const typeEncoders = {
  Object: (obj: unknown) => (obj instanceof F ? [new Token(Type.float, obj.v)] : null),
};

/** A float in the shortest IEEE 754 width that keeps it (cborg), -0.0 included (cborg 4.5.8
 * writes -0.0 as +0.0 in half width; Python writes f9 80 00). */
function encodeFloat(f: F): Uint8Array {
  if (Object.is(f.v, -0)) return Uint8Array.of(0xf9, 0x80, 0x00);
  return encode(f, { typeEncoders } as Parameters<typeof encode>[1]);
}

function head(major: number, n: number | bigint): Uint8Array {
  const v = BigInt(n);
  const m = major << 5;
  if (v < 24n) return Uint8Array.of(m | Number(v));
  const width = v < 0x100n ? 1 : v < 0x10000n ? 2 : v < 0x100000000n ? 4 : 8;
  return concat(Uint8Array.of(m | (24 + Math.log2(width))), be(v, width));
}

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

/** RFC 8949 §4.2.1 core deterministic CBOR of the values the two maps hold (non-negative
 * integers, text, bytes, arrays, text-keyed maps sorted bytewise by encoded key, null, booleans,
 * floats); the float width comes from cborg. */
function cbor(v: unknown): Uint8Array {
  if (v === null) return Uint8Array.of(0xf6);
  if (v === true) return Uint8Array.of(0xf5);
  if (v === false) return Uint8Array.of(0xf4);
  if (v instanceof F) return encodeFloat(v);
  if (typeof v === "number" || typeof v === "bigint") {
    if (typeof v === "number" && !Number.isSafeInteger(v)) fail("not an integer");
    if (BigInt(v) < 0n) fail("negative integers do not occur");
    return head(0, v);
  }
  if (typeof v === "string") {
    const b = new TextEncoder().encode(v);
    return concat(head(3, b.length), b);
  }
  if (v instanceof Uint8Array) return concat(head(2, v.length), v);
  if (Array.isArray(v)) return concat(head(4, v.length), ...v.map(cbor));
  if (v instanceof Map) {
    const entries = [...v.entries()].map(([k, x]) => [cbor(k), cbor(x)] as const)
      .sort((a, b) => compareBytes(a[0], b[0]));
    return concat(head(5, entries.length), ...entries.flat());
  }
  fail(`cannot encode ${typeof v}`);
}

function encodeMap(m: Map<string, unknown>): Uint8Array {
  return cbor(m);
}

/** Canonical CBOR of the ExecRequest in its JSON view (throws VerificationError "format"). */
export function encodeExecRequest(j: Json): Uint8Array { return encodeMap(execRequestMap(j)); }
export function encodeExecResult(j: Json): Uint8Array { return encodeMap(execResultMap(j)); }

export function hex(b: Uint8Array): `0x${string}` { return `0x${bytesToHex(b)}`; }
/** reqHash: sha256 of the canonical ExecRequest, 0x-hex. */
export function execRequestHash(j: Json): `0x${string}` { return hex(sha256(encodeExecRequest(j))); }
/** outHash: sha256 of the canonical ExecResult, 0x-hex. */
export function execResultHash(j: Json): `0x${string}` { return hex(sha256(encodeExecResult(j))); }
export function sha256Hex(data: Uint8Array | string): `0x${string}` {
  return hex(sha256(typeof data === "string" ? new TextEncoder().encode(data) : data));
}

const SEED_DOMAIN = new TextEncoder().encode("verinfer/seed/v1");
const CHOICE_DOMAIN = new TextEncoder().encode("verinfer/choice/v1");

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let i = 0;
  for (const p of parts) { out.set(p, i); i += p.length; }
  return out;
}
function be(v: bigint, n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = n - 1; i >= 0; i--) { out[i] = Number(v & 0xffn); v >>= 8n; }
  return out;
}

/** The request rule's seed of choice ``index`` for a body ``seed`` (request_rule.choice_seed). */
export function choiceSeed(seed: bigint, index: number): bigint {
  if (index === 0) return seed;
  const d = sha256(concat(CHOICE_DOMAIN, be(seed, 8), be(BigInt(index), 4)));
  const s = sha256(concat(SEED_DOMAIN, d));
  return BigInt(`0x${bytesToHex(s.slice(0, 8))}`);
}
