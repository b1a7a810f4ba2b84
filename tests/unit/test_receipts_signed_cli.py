"""SignedReceipt JSON and the `verinfer receipts` commands."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from verinfer.cli import app
from verinfer.protocol.errors import ReceiptFormatError
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.errors import SignatureError
from verinfer.receipts.signed import SignedReceipt

SIGNER = ReceiptSigner(hashlib.sha256(b"cli operator").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
RECEIPT = Receipt(operator=SIGNER.address, chain_id=31337, model_id=b"\x01" * 32,
                  engine_fingerprint_hash=b"\x02" * 32, req_hash=b"\x03" * 32,
                  out_hash=b"\x04" * 32, key_epoch=1, ciphertext_hash=b"\x05" * 32,
                  issued_at=1_700_000_000)


def test_signed_receipt_json_round_trip_and_checks() -> None:
    signed = SignedReceipt.sign(RECEIPT, DOMAIN, SIGNER)
    j = signed.to_json()
    assert SignedReceipt.from_json(json.loads(json.dumps(j))) == signed
    assert signed.verify(SIGNER.address) == SIGNER.address
    with pytest.raises(ReceiptFormatError, match="digest"):
        SignedReceipt.from_json({**j, "digest": "0x" + "00" * 32})
    with pytest.raises(ReceiptFormatError, match="domain"):
        SignedReceipt.from_json({**j, "domain": {**j["domain"], "name": "other"}})
    with pytest.raises(ReceiptFormatError, match="signature"):
        SignedReceipt.from_json({**j, "signature": j["signature"][:-2]})
    # the same signature presented for another chain: parses, but does not verify
    unsigned_digest = {k: v for k, v in j.items() if k != "digest"}
    moved = SignedReceipt.from_json({**unsigned_digest,
                                     "domain": {**j["domain"], "chainId": 1}})
    with pytest.raises(SignatureError):
        moved.verify()
    assert repr(SIGNER) == f"ReceiptSigner(address={SIGNER.address})"


def test_cli_verify_typed_data_and_vectors(tmp_path: Path) -> None:
    runner = CliRunner()
    good = tmp_path / "r.json"
    good.write_text(json.dumps(SignedReceipt.sign(RECEIPT, DOMAIN, SIGNER).to_json()))
    res = runner.invoke(app, ["receipts", "verify", str(good), "--operator", SIGNER.address])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["signer"] == SIGNER.address
    res = runner.invoke(app, ["receipts", "typed-data", str(good)])
    assert res.exit_code == 0 and json.loads(res.output)["primaryType"] == "Receipt"
    data = json.loads(good.read_text())
    data["receipt"]["outHash"] = "0x" + "44" * 32
    data.pop("digest")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    res = runner.invoke(app, ["receipts", "verify", str(bad)])
    assert res.exit_code == 1 and "invalid" in res.output
    res = runner.invoke(app, ["receipts", "vectors", "--check", "--out", str(tmp_path)])
    assert res.exit_code == 1
    res = runner.invoke(app, ["receipts", "vectors", "--out", str(tmp_path)])
    assert res.exit_code == 0 and (tmp_path / "merkle.json").exists()
