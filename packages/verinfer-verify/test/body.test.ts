// The body-level fields this package compares with the signed ExecRequest (checkBodyFields): the
// request rule's defaults, stop as a string or a list, logit_bias canonical form, the chat limit's
// two names, logprobs, and each choice's seed from a body seed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { checkBodyFields, choiceSeed, VerificationError } from "../src/index.js";
import type { Json } from "../src/json.js";

type Obj = Record<string, Json>;
const fail = (check: string, msg: string) => new VerificationError(check, msg, 0);
const signed: Obj = { version: 2, temperature: 1, top_p: 1, top_k: 0, ignore_eos: false, stop: [],
  prompt_commitments: null, top_logprobs: null, max_tokens: 256, seed: 5 };
const chat = (extra: Obj): Obj => ({ model: "m", messages: [], ...extra });

function differs(body: Obj, req: Obj, k = 0): string | null {
  try { checkBodyFields(body, "messages" in body ? "chat" : "completions", k, req, fail); return null; }
  catch (e) { assert.ok(e instanceof VerificationError); assert.equal(e.check, "request"); return e.message; }
}

test("defaults: an empty body is held to temperature 1, top_p 1, top_k 0, no stop", () => {
  assert.equal(differs(chat({}), signed), null);
  assert.match(differs(chat({}), { ...signed, temperature: 0 }) ?? "", /temperature/);
  assert.match(differs(chat({}), { ...signed, top_k: 40 }) ?? "", /top_k/);
  assert.match(differs(chat({}), { ...signed, ignore_eos: true }) ?? "", /ignore_eos/);
});

test("stop: a string is a list of one; order counts", () => {
  assert.equal(differs(chat({ stop: "\n" }), { ...signed, stop: ["\n"] }), null);
  assert.match(differs(chat({ stop: ["a", "b"] }), { ...signed, stop: ["b", "a"] }) ?? "", /stop/);
});

test("logit_bias: zero biases dropped, ids ascending; penalties default 0", () => {
  const req = { ...signed, sampler: "vi-sample-v3", logit_bias: [[3, -1.5], [12, 2]] };
  assert.equal(differs(chat({ logit_bias: { "12": 2, "3": -1.5, "7": 0 } }), req), null);
  assert.match(differs(chat({ logit_bias: { "12": 3, "3": -1.5 } }), req) ?? "", /logit_bias/);
  assert.match(differs(chat({ presence_penalty: 0.5 }), signed) ?? "", /presence_penalty/);
});

test("max tokens: max_completion_tokens wins in chat; omitted is not compared", () => {
  assert.equal(differs(chat({ max_completion_tokens: 9, max_tokens: 3 }), { ...signed, max_tokens: 9 }), null);
  assert.match(differs(chat({ max_tokens: 3 }), { ...signed, max_tokens: 9 }) ?? "", /max_tokens/);
  assert.equal(differs({ prompt: "x", max_tokens: 9 }, { ...signed, max_tokens: 9 }), null);
});

test("logprobs: chat's flag and top_logprobs, completions' integer", () => {
  assert.equal(differs(chat({ logprobs: true }), { ...signed, top_logprobs: 0 }), null);
  assert.equal(differs(chat({ logprobs: true, top_logprobs: 3 }), { ...signed, top_logprobs: 3 }), null);
  assert.match(differs(chat({}), { ...signed, top_logprobs: 0 }) ?? "", /top_logprobs/);
  assert.equal(differs({ prompt: "x", logprobs: 2 }, { ...signed, top_logprobs: 2 }), null);
});

test("seed: choice k is held to choice_seed(body seed, k), u64 exact", () => {
  const seed = 2n ** 64n - 2n;
  assert.equal(differs(chat({ seed }), { ...signed, seed }), null);
  assert.equal(differs(chat({ seed }), { ...signed, seed: choiceSeed(seed, 1) }, 1), null);
  assert.match(differs(chat({ seed }), { ...signed, seed: seed + 1n }) ?? "", /seed/);
  assert.match(differs(chat({ seed }), { ...signed, seed }, 1) ?? "", /seed/);
});

test("response_format: a grammar exactly when asked, json_object's spec", () => {
  const g = { ...signed, grammar_spec: '{"type":"json_object"}', grammar_engine: "e", grammar_hash: "0x" };
  assert.equal(differs(chat({ response_format: { type: "json_object" } }), g), null);
  assert.match(differs(chat({}), g) ?? "", /grammar/);
  assert.match(differs(chat({ response_format: { type: "json_object" } }), signed) ?? "", /grammar/);
  const schema = { type: "object", properties: { b: { type: "string" }, a: { type: "integer" } } };
  const gs = { ...g, grammar_spec: JSON.stringify({ type: "json_schema", schema }) };
  const rf = (s: Json) => ({ response_format: { type: "json_schema", json_schema: { name: "n", schema: s } } });
  assert.equal(differs(chat(rf(schema)), gs), null);
  assert.match(differs(chat(rf(schema)), { ...gs, grammar_spec: JSON.stringify({ schema, type: "json_schema" }) }) ?? "",
    /grammar_spec/);
  assert.match(differs(chat(rf({ ...schema, properties: { a: { type: "integer" }, b: { type: "string" } } })), gs) ?? "",
    /grammar_spec/);
});
