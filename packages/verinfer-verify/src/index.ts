export { VerificationError } from "./errors.js";
export { parseJson, type Json } from "./json.js";
export { encodeExecRequest, encodeExecResult, execRequestHash, execResultHash, choiceSeed, sha256Hex } from "./canonical.js";
export { verifyResponse, checkBodyFields, receivedOf, endpointOf, RULE, RECEIPT_TYPE, RECEIPT_FIELDS,
  type Expected, type Received, type Checked } from "./verify.js";
