#!/usr/bin/env node
// verinfer-verify REQUEST.json RESPONSE.json --chain-id N --contract 0x.. [--operator 0x..]
//   [--model NAME=0xID] [--now UNIX]: prints "valid" (exit 0) or "invalid: <check>: ..." (exit 1).
import { readFileSync } from "node:fs";
import { verifyResponse, VerificationError } from "./index.js";

async function main(argv: string[]): Promise<number> {
  const pos: string[] = [];
  const opt: Record<string, string[]> = {};
  for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith("--")) (opt[argv[i].slice(2)] ??= []).push(argv[++i]);
    else pos.push(argv[i]);
  }
  if (pos.length !== 2 || !opt["chain-id"] || !opt.contract) {
    process.stderr.write("usage: verinfer-verify REQUEST.json RESPONSE.json --chain-id N --contract 0x.. [--operator 0x..] [--model NAME=0xID] [--now UNIX]\n");
    return 2;
  }
  const models = opt.model ? Object.fromEntries(opt.model.map((s) => s.split("=", 2))) : undefined;
  try {
    const checked = await verifyResponse(readFileSync(pos[0], "utf8"), readFileSync(pos[1], "utf8"), {
      chainId: BigInt(opt["chain-id"][0]), verifyingContract: opt.contract[0], operators: opt.operator,
      models, now: opt.now ? () => Number(opt.now[0]) : undefined,
    });
    process.stdout.write(`valid ${checked.length} choice(s), operator ${checked[0].operator}\n`);
    return 0;
  } catch (e) {
    if (e instanceof VerificationError) {
      process.stdout.write(`invalid: ${e.message}\n`);
      return 1;
    }
    throw e;
  }
}

main(process.argv.slice(2)).then((rc) => { process.exitCode = rc; });
