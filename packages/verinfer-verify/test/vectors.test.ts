// The shared vectors (tests/vectors/exec_requests.json, written by scripts/gen-client-vectors from
// the Python codec): this package must give the same canonical bytes and hash for every one.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { bytesToHex } from "@noble/hashes/utils";
import { hashTypedData, recoverTypedDataAddress, type Hex } from "viem";
import { choiceSeed, encodeExecRequest, encodeExecResult, execRequestHash, execResultHash,
  EXTENDED_SAMPLER } from "../src/canonical.js";
import { parseJson, type Json } from "../src/json.js";
import { DOMAIN_NAME, DOMAIN_VERSION, MAX_ISSUED_AT_SKEW_S, RECEIPT_FIELDS, RECEIPT_TYPE, RULE,
  verifyResponse } from "../src/verify.js";
import { VerificationError } from "../src/errors.js";
import { choiceMessage, grammarSpec, MAX_EXACT_FLOAT_INT, MAX_TOOLS, pyLoads, toolPolicy, ToolRuleError,
  type ToolPolicy } from "../src/tools.js";

const file = fileURLToPath(new URL("../../../../tests/vectors/exec_requests.json", import.meta.url));
const vectors = parseJson(readFileSync(file, "utf8")) as {
  rule: Record<string, Json>;
  choice_seeds: { seed: string; index: number; choice_seed: string }[];
  exec_requests: { json: Json; cbor: string; hash: string }[];
  exec_results: { json: Json; cbor: string; hash: string }[];
  receipts: { typed_data: Record<string, any>; signature: Hex; digest: Hex; signer: string }[];
};

test("at least 200 ExecRequest vectors", () => {
  assert.ok(vectors.exec_requests.length >= 200, `${vectors.exec_requests.length} vectors`);
});

test("every ExecRequest encodes to Python's canonical CBOR and hash", () => {
  let same = 0;
  for (const [i, v] of vectors.exec_requests.entries()) {
    assert.equal(bytesToHex(encodeExecRequest(v.json)), v.cbor, `vector ${i}: CBOR differs`);
    assert.equal(execRequestHash(v.json), v.hash, `vector ${i}: hash differs`);
    same++;
  }
  assert.equal(same, vectors.exec_requests.length);
});

test("a changed field changes the hash", () => {
  for (const v of vectors.exec_requests.slice(0, 20)) {
    const j = { ...(v.json as Record<string, Json>) };
    j.temperature = (j.temperature as number) === 0 ? 0.5 : 0;
    assert.notEqual(execRequestHash(j), v.hash);
    assert.equal(execRequestHash(v.json), v.hash);
  }
});

test("choice seeds equal request_rule.choice_seed", () => {
  for (const c of vectors.choice_seeds) {
    assert.equal(choiceSeed(BigInt(c.seed), c.index).toString(), c.choice_seed,
      `seed ${c.seed} index ${c.index}`);
  }
});

test("the rule's defaults here are Python's", () => {
  assert.equal(RULE.DEFAULT_TEMPERATURE, vectors.rule.DEFAULT_TEMPERATURE);
  assert.equal(RULE.DEFAULT_TOP_P, vectors.rule.DEFAULT_TOP_P);
  assert.equal(RULE.DEFAULT_N, vectors.rule.DEFAULT_N);
  assert.equal(EXTENDED_SAMPLER, vectors.rule.EXTENDED_SAMPLER);
});

test("every ExecResult (logprobs, -0.0, subnormals) encodes to Python's bytes and outHash", () => {
  assert.ok(vectors.exec_results.length >= 20);
  for (const [i, v] of vectors.exec_results.entries()) {
    assert.equal(bytesToHex(encodeExecResult(v.json)), v.cbor, `result ${i}: CBOR differs`);
    assert.equal(execResultHash(v.json), v.hash, `result ${i}: hash differs`);
  }
});

test("receipts: this package's EIP-712 struct gives Python's digest and recovers its signer", async () => {
  assert.equal(RECEIPT_TYPE, vectors.rule.RECEIPT_TYPE);
  assert.equal(DOMAIN_NAME, vectors.rule.DOMAIN_NAME);
  assert.equal(DOMAIN_VERSION, vectors.rule.DOMAIN_VERSION);
  assert.equal(MAX_ISSUED_AT_SKEW_S, vectors.rule.MAX_ISSUED_AT_SKEW_S);
  for (const [i, r] of vectors.receipts.entries()) {
    const td = { domain: r.typed_data.domain, types: { Receipt: RECEIPT_FIELDS.map((f) => ({ ...f })) },
      primaryType: "Receipt" as const, message: r.typed_data.message };
    assert.equal(hashTypedData(td as never), r.digest, `receipt ${i}: digest differs`);
    assert.equal(await recoverTypedDataAddress({ ...td, signature: r.signature } as never), r.signer,
      `receipt ${i}: signer differs`);
  }
});

// ---- tool calling (verinfer.protocol.tools): the same policies, grammar specs and messages ----
type ToolBodyVector = { body: string; error?: string; policy?: any; grammar_spec?: string | null };
type ToolOutputVector = { body: string; req_hash: string; text: string; error?: string;
  content?: string | null; tool_calls?: any[] | null };
const toolBodies = (vectors as any).tool_bodies as ToolBodyVector[];
const toolOutputs = (vectors as any).tool_outputs as ToolOutputVector[];

const policyOf = (text: string) => {
  const b = pyLoads(text);
  assert.ok(b instanceof Map);
  return toolPolicy(b);
};

test("the tool rule's limits here are Python's", () => {
  assert.equal(MAX_TOOLS, vectors.rule.MAX_TOOLS);
  assert.equal(BigInt(MAX_EXACT_FLOAT_INT), BigInt(vectors.rule.MAX_EXACT_FLOAT_INT as bigint));
});

test("every body's tool policy and forced-call grammar spec equal Python's (or the same refusal)", () => {
  assert.ok(toolBodies.length >= 25);
  for (const [i, v] of toolBodies.entries()) {
    if (v.error !== undefined) {
      assert.throws(() => policyOf(v.body), (e: unknown) => e instanceof ToolRuleError && e.param === v.error,
        `body ${i}: Python refuses it with param ${v.error}`);
      continue;
    }
    const p = policyOf(v.body);
    assert.deepEqual(p, v.policy, `body ${i}: policy differs`);
    assert.equal(grammarSpec(p), v.grammar_spec, `body ${i}: grammar spec differs`);
  }
});

test("every output text reads as Python's message: content, tool_calls, ids (or raises as it does)", () => {
  assert.ok(toolOutputs.length >= 1000 && toolOutputs.filter((v) => v.tool_calls).length >= 100);
  const policies = new Map<string, ToolPolicy | null>();
  for (const [i, v] of toolOutputs.entries()) {
    if (!policies.has(v.body)) policies.set(v.body, policyOf(v.body));
    const p = policies.get(v.body)!;
    if (v.error !== undefined) {
      assert.throws(() => choiceMessage(p, v.text, v.req_hash), `output ${i}: Python raises ${v.error}`);
      continue;
    }
    const got = choiceMessage(p, v.text, v.req_hash);
    assert.equal(got.content, v.content, `output ${i}: content differs (${JSON.stringify(v.text)})`);
    assert.deepEqual(got.toolCalls, v.tool_calls, `output ${i}: tool_calls differ (${JSON.stringify(v.text)})`);
  }
});

test("a receipt's tool-call answer: the message derived from output_text passes, a tampered one names its check", async () => {
  const { privateKeyToAccount } = await import("viem/accounts");
  const { sha256Hex } = await import("../src/canonical.js");
  const account = privateKeyToAccount(`0x${"42".repeat(32)}`);
  const contract = "0x" + "11".repeat(20);
  const v = toolOutputs.find((o) => o.tool_calls && o.tool_calls.length === 2 && o.content)!;
  const body = `{"model":"m","messages":[{"role":"user","content":"hi"}],${v.body.slice(1)}`;
  // an ExecRequest the body's defaults give (no seed, max_tokens or grammar in the body: unchecked)
  const reqJson: Record<string, Json> = { ...(vectors.exec_requests[1].json as Record<string, Json>),
    temperature: 1, top_p: 1, top_k: 0, stop: [], ignore_eos: false, prompt_commitments: null,
    top_logprobs: null };
  const resJson: Record<string, Json> = { ...(vectors.exec_results[0].json as Record<string, Json>),
    finish_reason: "stop", text_sha256: sha256Hex(v.text) };
  const message = { version: 1, operator: account.address, chainId: 31337n, modelId: reqJson.model_id,
    engineFingerprintHash: sha256Hex(reqJson.engine_fingerprint as string),
    reqHash: execRequestHash(reqJson), outHash: execResultHash(resJson), keyEpoch: 1n,
    ciphertextHash: "0x" + "00".repeat(32), issuedAt: 1_800_000_000n };
  const domain = { name: DOMAIN_NAME, version: DOMAIN_VERSION, chainId: 31337n, verifyingContract: contract as Hex };
  const signature = await account.signTypedData({ domain, types: { Receipt: RECEIPT_FIELDS.map((f) => ({ ...f })) },
    primaryType: "Receipt", message: message as never });
  const { content, toolCalls } = choiceMessage(policyOf(v.body), v.text, message.reqHash);
  const answer = (edit?: (c: any) => void) => {
    const choice: any = { index: 0, finish_reason: "tool_calls", verinfer: { output_text: v.text },
      message: { role: "assistant", content, tool_calls: structuredClone(toolCalls) } };
    edit?.(choice);
    return { choices: [choice], verification: { receipt: {
      domain: { ...domain, chainId: 31337 }, message: { ...message, chainId: 31337, keyEpoch: 1, issuedAt: 1_800_000_000 } },
    signature, exec_request: reqJson, exec_result: resJson } };
  };
  const x = { chainId: 31337, verifyingContract: contract, now: () => 1_800_000_000 };
  const checkOf = async (resp: object) => {
    try { await verifyResponse(body, resp, x); return "valid"; } catch (e) {
      if (e instanceof VerificationError) return e.check;
      throw e;
    }
  };
  assert.equal(await checkOf(answer()), "valid");
  assert.equal(await checkOf(answer((c) => { c.message.tool_calls[1].function.arguments = '{"x":1}'; })), "tool_calls");
  assert.equal(await checkOf(answer((c) => { c.message.tool_calls[0].id = "call_" + "0".repeat(24); })), "tool_calls");
  assert.equal(await checkOf(answer((c) => { c.message.tool_calls.pop(); })), "tool_calls");
  assert.equal(await checkOf(answer((c) => { c.message.tool_calls.push(c.message.tool_calls[0]); })), "tool_calls");
  assert.equal(await checkOf(answer((c) => { c.message.content = "changed"; })), "content");
  assert.equal(await checkOf(answer((c) => { c.finish_reason = "stop"; })), "output");
  assert.equal(await checkOf(answer((c) => { c.verinfer.output_text += " "; })), "output");
  assert.equal(await checkOf(answer((c) => { delete c.verinfer; })), "output");
});

test("a completion changed behind a verinfer.output_text holding the signed text is refused (output)", async () => {
  // output_text stands for the text in a chat answer only (where the message is checked against
  // it); a completion's text is the text checked, else a front end could serve any text beside it
  const { privateKeyToAccount } = await import("viem/accounts");
  const { sha256Hex } = await import("../src/canonical.js");
  const account = privateKeyToAccount(`0x${"42".repeat(32)}`);
  const contract = "0x" + "11".repeat(20);
  const signed = "Hello there.";
  const body = '{"model":"m","prompt":"hi"}';
  const reqJson: Record<string, Json> = { ...(vectors.exec_requests[1].json as Record<string, Json>),
    temperature: 1, top_p: 1, top_k: 0, stop: [], ignore_eos: false, prompt_commitments: null,
    top_logprobs: null };
  const resJson: Record<string, Json> = { ...(vectors.exec_results[0].json as Record<string, Json>),
    finish_reason: "stop", text_sha256: sha256Hex(signed) };
  const message = { version: 1, operator: account.address, chainId: 31337n, modelId: reqJson.model_id,
    engineFingerprintHash: sha256Hex(reqJson.engine_fingerprint as string),
    reqHash: execRequestHash(reqJson), outHash: execResultHash(resJson), keyEpoch: 1n,
    ciphertextHash: "0x" + "00".repeat(32), issuedAt: 1_800_000_000n };
  const domain = { name: DOMAIN_NAME, version: DOMAIN_VERSION, chainId: 31337n, verifyingContract: contract as Hex };
  const signature = await account.signTypedData({ domain, types: { Receipt: RECEIPT_FIELDS.map((f) => ({ ...f })) },
    primaryType: "Receipt", message: message as never });
  const answer = (text: string, verinfer?: object) => ({
    choices: [{ index: 0, text, finish_reason: "stop", ...(verinfer ? { verinfer } : {}) }],
    verification: { receipt: { domain: { ...domain, chainId: 31337 },
      message: { ...message, chainId: 31337, keyEpoch: 1, issuedAt: 1_800_000_000 } },
    signature, exec_request: reqJson, exec_result: resJson } });
  const x = { chainId: 31337, verifyingContract: contract, now: () => 1_800_000_000 };
  const checkOf = async (resp: object) => {
    try { await verifyResponse(body, resp, x); return "valid"; } catch (e) {
      if (e instanceof VerificationError) return e.check;
      throw e;
    }
  };
  assert.equal(await checkOf(answer(signed)), "valid");
  assert.equal(await checkOf(answer("Visit https://evil.example")), "output");
  assert.equal(await checkOf(answer("Visit https://evil.example", { output_text: signed })), "output");
});
