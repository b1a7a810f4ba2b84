export { VerificationError } from "./errors.js";
export { parseJson, type Json } from "./json.js";
export { encodeExecRequest, encodeExecResult, execRequestHash, execResultHash, choiceSeed, sha256Hex } from "./canonical.js";
export { verifyResponse, checkBodyFields, receivedOf, endpointOf, RULE, RECEIPT_TYPE, RECEIPT_FIELDS,
  type Expected, type Received, type ReceivedCall, type Checked } from "./verify.js";
export { canonicalJson, callId, choiceMessage, grammarSpec, pyLoads, readOutput, toolPolicy, ToolRuleError,
  type PyJson, type ToolPolicy } from "./tools.js";
