"""The committed shared vectors equal a regeneration and check out against eth-account."""

from __future__ import annotations

import json
from pathlib import Path

from eth_account import Account
from eth_account.messages import _hash_eip191_message, encode_typed_data

from verinfer.protocol.fields import parse_hex
from verinfer.receipts.eip712 import Domain, Receipt, verify_receipt
from verinfer.receipts.merkle import MerkleProof, verify_proof
from verinfer.receipts.vectors import MERKLE_COUNTS, expected_files, main

VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def test_committed_files_equal_regeneration() -> None:
    for name, text in expected_files().items():
        assert (VECTORS / name).read_text() == text, f"{name} is stale: run the generator"
    assert main(["--check", "--out", str(VECTORS)]) == 0


def test_check_mode_reports_stale_files(tmp_path: Path) -> None:
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--check", "--out", str(tmp_path)]) == 0


def test_receipt_vectors_verify_independently() -> None:
    data = json.loads((VECTORS / "receipts.json").read_text())
    assert data["count"] == len(data["cases"]) >= 3
    assert len({c["chainId"] for c in data["cases"]}) == len(data["cases"])
    for case in data["cases"]:
        domain = Domain(case["chainId"], case["verifyingContract"])
        fields = {k: case[k] for k in ("version", "operator", "chainId", "modelId",
                                       "engineFingerprintHash", "reqHash", "outHash",
                                       "keyEpoch", "ciphertextHash", "issuedAt")}
        receipt = Receipt.from_json(fields)
        typed = receipt.as_typed_data(domain)
        digest = _hash_eip191_message(encode_typed_data(full_message=typed))
        assert "0x" + digest.hex() == case["digest"]
        sig = parse_hex(case["signature"], 65, "signature")
        assert Account.from_key(case["privateKey"]).address == case["signer"] == case["operator"]
        assert bytes(Account.sign_typed_data(case["privateKey"], full_message=typed).signature) \
            == sig
        assert verify_receipt(receipt, domain, sig, case["signer"]) == case["signer"]
        assert case["r"] + case["s"][2:] + f"{case['v']:02x}" == case["signature"]


def test_merkle_vectors_cover_odd_counts_and_verify() -> None:
    data = json.loads((VECTORS / "merkle.json").read_text())
    assert [t["leafCount"] for t in data["trees"]] == list(MERKLE_COUNTS)
    for tree in data["trees"]:
        root = parse_hex(tree["root"], 32, "root")
        assert len(tree["proofs"]) == tree["leafCount"] == len(tree["digests"])
        for p, d in zip(tree["proofs"], tree["digests"], strict=True):
            proof = MerkleProof(p["index"], tuple(parse_hex(s, 32, "s") for s in p["siblings"]),
                                p["leafCount"])
            assert verify_proof(parse_hex(d, 32, "digest"), proof, root)
