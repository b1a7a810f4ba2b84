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
import { DOMAIN_NAME, DOMAIN_VERSION, MAX_ISSUED_AT_SKEW_S, RECEIPT_FIELDS, RECEIPT_TYPE, RULE }
  from "../src/verify.js";

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
