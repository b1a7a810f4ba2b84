"""The hex fields of the KMS, enclave and receipts formats go through the one parser
(verinfer.protocol.hexutil). ``bytes.fromhex(x[2:])`` / ``removeprefix("0x")`` — the copies it
replaced — decoded values whose first two characters were anything ("1x…"), accepted spaces
between bytes and, for request fields, the missing prefix; each format now refuses them with its
own typed error, and keeps the leniency only where a person types the value (keys, CLI args)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verinfer.attestation.errors import QuoteMalformedError
from verinfer.attestation.quotes import parse_hex as quote_hex
from verinfer.kms.allowlist import FileMeasurementAllowlist
from verinfer.kms.committee import FileCommitteeOracle
from verinfer.kms.errors import BadReleaseRequest, RegistryError, SealError
from verinfer.kms.protocol import AuditAssignment, unhex
from verinfer.kms.sealing import load_seal_key
from verinfer.protocol.hexutil import HexFormatError

ADDR = "0x" + "ab" * 20
MALFORMED = ["1x" + "ab" * 20,      # the old [2:] dropped any two leading characters
             "0x" + "ab " * 19 + "ab",  # bytes.fromhex accepts spaces between bytes
             "ab" * 20]             # no prefix: every writer of a request prefixes


def test_release_request_fields_are_strict_and_typed() -> None:
    assert unhex(ADDR, "requester", 20) == bytes([0xAB]) * 20
    for bad in MALFORMED:
        with pytest.raises(BadReleaseRequest) as e:
            unhex(bad, "requester", 20)
        assert e.value.param == "requester"
    with pytest.raises(BadReleaseRequest):
        unhex("0x" + "ab" * 19, "requester", 20)  # a byte short


def test_an_error_does_not_echo_a_huge_field() -> None:
    with pytest.raises(BadReleaseRequest) as e:
        unhex("0x" + "z" * 1_000_000, "nonces.1", 32)
    assert len(e.value.message) < 300


def test_audit_assignment_digest_refuses_a_malformed_auditor() -> None:
    good = AuditAssignment(b"\x01" * 32, ADDR, 10, b"\x02" * 65)
    assert len(good.digest()) == 32
    with pytest.raises(HexFormatError):
        AuditAssignment(b"\x01" * 32, "1x" + "ab" * 20, 10, b"\x02" * 65).digest()


def test_seal_key_prefix_optional_digits_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "c3" * 32
    for spelling in (key, "0x" + key):
        monkeypatch.setenv("VERINFER_TEST_SEAL_HEX", spelling)
        assert load_seal_key(None, "VERINFER_TEST_SEAL_HEX") == bytes([0xC3]) * 32
    monkeypatch.setenv("VERINFER_TEST_SEAL_HEX", "1x" + key)
    with pytest.raises(SealError) as e:
        load_seal_key(None, "VERINFER_TEST_SEAL_HEX")
    assert "c3c3" not in str(e.value)  # a near-miss key is still a secret: never echoed


def test_quote_fields_bare_or_prefixed_never_garbled() -> None:
    raw = bytes(range(32))
    assert quote_hex(raw.hex(), 32, "quote.root") == raw
    assert quote_hex("0x" + raw.hex(), 32, "quote.root") == raw
    for bad in ("1x" + raw.hex(), raw.hex()[:-2] + " 1f", raw.hex()[:-2], None):
        with pytest.raises(QuoteMalformedError):
            quote_hex(bad, 32, "quote.root")


def test_registry_files_refuse_garbled_hex(tmp_path: Path) -> None:
    allow = tmp_path / "allow.json"
    allow.write_text(json.dumps({"measurements": ["1x" + "00" * 32]}))
    with pytest.raises(RegistryError):
        FileMeasurementAllowlist(allow).allowed()
    allow.write_text(json.dumps({"measurements": ["0x" + "00" * 32]}))
    assert FileMeasurementAllowlist(allow).allowed() == frozenset({b"\x00" * 32})
    committee = tmp_path / "committee.json"
    committee.write_text(json.dumps({"verifiers": [ADDR], "challenges": {"1": {
        "status": "open", "committee": [ADDR], "receipt_hash": "1x" + "11" * 32}}}))
    with pytest.raises(RegistryError):
        FileCommitteeOracle(committee)._load()
