"""eth-account's EIP-712 signing agrees with the shared vectors and verinfer.receipts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eth_account import Account

from verinfer.chain.signing import sign_receipt_typed, typed_data_digest
from verinfer.receipts.eip712 import Domain, Receipt

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "receipts.json"


def _cases() -> list[dict[str, object]]:
    return list(json.loads(VECTORS.read_text())["cases"])


@pytest.mark.parametrize("case", _cases(), ids=lambda c: str(c["name"]))
def test_chain_signing_matches_shared_vectors(case: dict[str, object]) -> None:
    fields = {k: case[k] for k in ("version", "operator", "chainId", "modelId",
                                   "engineFingerprintHash", "reqHash", "outHash", "keyEpoch",
                                   "ciphertextHash", "issuedAt")}
    receipt = Receipt.from_json(fields)
    domain = Domain(chain_id=int(case["chainId"]),  # type: ignore[call-overload]
                    verifying_contract=str(case["verifyingContract"]))
    digest = typed_data_digest(receipt, domain)
    assert "0x" + digest.hex() == case["digest"]
    assert digest == receipt.digest(domain)
    account = Account.from_key(str(case["privateKey"]))
    sig = sign_receipt_typed(receipt, domain, account)
    assert "0x" + sig.hex() == case["signature"]
    assert sig[64] in (27, 28)


def test_chain_signing_other_domain_changes_digest() -> None:
    case = _cases()[0]
    fields = {k: case[k] for k in ("version", "operator", "chainId", "modelId",
                                   "engineFingerprintHash", "reqHash", "outHash", "keyEpoch",
                                   "ciphertextHash", "issuedAt")}
    receipt = Receipt.from_json(fields)
    a = Domain(chain_id=1, verifying_contract="0x" + "11" * 20)
    b = Domain(chain_id=2, verifying_contract="0x" + "11" * 20)
    assert typed_data_digest(receipt, a) != typed_data_digest(receipt, b)
