"""Shared test vectors (tests/vectors/receipts.json, merkle.json) for pytest and Foundry.

Regenerate with ``python -m verinfer.receipts.vectors [--out DIR] [--check]``. Everything is
derived from fixed labels, so a regeneration is byte-identical; tests compare against it.
Shapes (flat, 0x-hex strings, JSON numbers for small ints) are documented in docs/receipts.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import (
    DOMAIN_TYPE,
    DOMAIN_TYPEHASH,
    RECEIPT_TYPE,
    RECEIPT_TYPEHASH,
    Domain,
    Receipt,
    address_of,
    sign_receipt,
)
from verinfer.receipts.merkle import build_tree

MERKLE_COUNTS = (1, 2, 3, 5, 7, 8)
_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
# (name, chain id, verifying contract): anvil's first deployment address, mainnet, Holesky.
DOMAINS = (
    ("anvil", 31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3"),
    ("mainnet", 1, "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"),
    ("holesky", 17000, "0x9fE46736679d2D9a65F0992F2272dE9f3c7fa6e0"),
)
DEFAULT_OUT = Path(__file__).resolve().parents[3] / "tests" / "vectors"


def _h(label: str) -> bytes:
    return hashlib.sha256(b"verinfer/vectors/v1/" + label.encode()).digest()


def _key(label: str) -> bytes:
    return (int.from_bytes(_h("key/" + label), "big") % (_N - 1) + 1).to_bytes(32, "big")


def receipt_case(name: str, chain_id: int, contract: str, i: int) -> dict[str, Any]:
    key = _key(f"operator/{i}")
    domain = Domain(chain_id, contract)
    receipt = Receipt(operator=address_of(key), chain_id=chain_id, model_id=_h(f"{name}/model"),
                      engine_fingerprint_hash=_h(f"{name}/engine"), req_hash=_h(f"{name}/req"),
                      out_hash=_h(f"{name}/out"), key_epoch=i + 1,
                      ciphertext_hash=_h(f"{name}/ciphertext"),
                      issued_at=1_767_225_600 + 3_600 * i)
    sig = sign_receipt(receipt, domain, key)
    return {
        "name": name,
        "chainId": chain_id,
        "verifyingContract": domain.verifying_contract,
        "domainSeparator": to_hex(domain.separator),
        **receipt.message(),
        "structHash": to_hex(receipt.struct_hash),
        "digest": to_hex(receipt.digest(domain)),
        "privateKey": to_hex(key),
        "signer": receipt.operator,
        "signature": to_hex(sig),
        "r": to_hex(sig[:32]),
        "s": to_hex(sig[32:64]),
        "v": sig[64],
    }


def generate_receipts() -> dict[str, Any]:
    cases = [receipt_case(name, cid, addr, i) for i, (name, cid, addr) in enumerate(DOMAINS)]
    return {
        "receiptType": RECEIPT_TYPE,
        "receiptTypeHash": to_hex(RECEIPT_TYPEHASH),
        "domainType": DOMAIN_TYPE,
        "domainTypeHash": to_hex(DOMAIN_TYPEHASH),
        "domainName": "verinfer",
        "domainVersion": "1",
        "count": len(cases),
        "cases": cases,
    }


def generate_merkle() -> dict[str, Any]:
    trees = []
    for n in MERKLE_COUNTS:
        digests = [_h(f"merkle/{n}/{i}") for i in range(n)]
        tree = build_tree(digests)
        trees.append({
            "leafCount": n,
            "digests": [to_hex(d) for d in digests],
            "leaves": [to_hex(leaf) for leaf in tree.leaves],
            "root": to_hex(tree.root),
            "proofs": [tree.proof(i).to_json() for i in range(n)],
        })
    return {"leafPrefix": "0x00", "nodePrefix": "0x01", "count": len(trees), "trees": trees}


def render(obj: dict[str, Any]) -> str:
    return json.dumps(obj, indent=2) + "\n"


def expected_files() -> dict[str, str]:
    return {"receipts.json": render(generate_receipts()),
            "merkle.json": render(generate_merkle())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="fail if the files differ")
    args = ap.parse_args(argv)
    stale = []
    for name, text in expected_files().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale vectors: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
