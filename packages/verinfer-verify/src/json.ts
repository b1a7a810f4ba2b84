// JSON with exact integers: a seed or a chain id above 2^53 must not be rounded by JSON.parse
// (an ExecRequest's seed is a u64). Integer literals become numbers when safe, bigints otherwise;
// every other number is a double (the schema says which fields are floats).
import { isInteger, parse } from "lossless-json";

export type Json = null | boolean | number | bigint | string | Json[] | { [k: string]: Json };

function parseNumber(text: string): number | bigint {
  if (isInteger(text)) {
    const b = BigInt(text);
    return b >= BigInt(Number.MIN_SAFE_INTEGER) && b <= BigInt(Number.MAX_SAFE_INTEGER)
      ? Number(b) : b;
  }
  return Number(text);
}

export function parseJson(text: string): Json {
  return parse(text, null, parseNumber) as Json;
}
