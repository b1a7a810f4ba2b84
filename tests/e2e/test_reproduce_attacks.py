"""The operator (or whoever hands the auditor its inputs) attacks `verinfer reproduce`; each
attack ends in "mismatch" or "cannot reproduce" with a reason, never a crash or a false
"reproduced". Same shared devnet as test_reproduce.py (tests/support/cookbook.py).

- a nesting bomb as the ciphertext (the receipt commits to it): it does not open under the
  epoch's own key — mismatch (faulty evidence);
- a nesting bomb as the sealed request body: bounded parse — mismatch;
- a verification object whose da_pointer names another response's ciphertext: skipped, the
  receipt's own content address read instead (absent: cannot reproduce);
- a blob over the size cap: not read as the ciphertext;
- hostile reference files (a bomb, a forged signature, unknown ids and pointers);
- a receipt signed for another chain's domain;
- a bomb or garbage as the transcript or the app key file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support.cookbook import BOMB, AuditNet, audit_net
from verinfer.auditor.material import AuditInputError, load_app_key, load_transcript
from verinfer.auditor.reproduce import AuditConfig, Auditor, ChainAccess
from verinfer.da_client.local import LocalDAClient
from verinfer.devnet.network import bind
from verinfer.receipts.envelope import EnvelopeContents


@pytest.fixture(scope="module")
def net(request: pytest.FixtureRequest) -> AuditNet:
    return audit_net(request.config)


def _auditor(net: AuditNet, *, chain: bool = True, **cfg: Any) -> Auditor:
    dn = net.devnet
    access = (ChainAccess(dn.view, bind(dn.w3, dn.deployment), dn.rpc_url, net.deployment)
              if chain else None)
    return Auditor(AuditConfig(models=[str(net.model)], app_key=load_app_key(net.app_key),
                               da_args=["--da-store", net.da_store], da_backends=["local"],
                               **cfg), chain=access, da=LocalDAClient(net.da_store))


def test_nesting_bomb_as_ciphertext_is_a_mismatch_not_a_crash(net: AuditNet) -> None:
    report = _auditor(net).run(str(net.refs["bomb_ciphertext"]))
    assert report.verdict.outcome == "mismatch", report.to_json()
    assert "does not open under key epoch 1's key" in report.verdict.reason


def test_nesting_bomb_as_request_body_is_a_mismatch_not_a_crash(net: AuditNet) -> None:
    report = _auditor(net).run(str(net.refs["bomb_request_body"]))
    assert report.verdict.outcome == "mismatch", report.to_json()
    assert "request body is not acceptable JSON" in report.verdict.reason


def test_a_pointer_to_other_bytes_is_skipped_not_believed(net: AuditNet,
                                                          tmp_path: Path) -> None:
    """The operator hands the client a verification object whose da_pointer names another
    response's ciphertext (a batch manifest cannot: da_client/manifest.py refuses an entry
    whose pointer is not the receipt's ciphertextHash). The auditor notes it and reads the
    receipt's own content address instead; with that absent, it cannot reproduce."""
    decoy = json.loads(net.refs["seeded"].read_text())["verification"]["da_pointer"]
    doc = json.loads(net.refs["greedy"].read_text())
    doc["verification"]["da_pointer"] = decoy
    lied = tmp_path / "lied.json"
    lied.write_text(json.dumps(doc))
    report = _auditor(net).run(str(lied))
    assert report.verdict.outcome == "reproduced", report.to_json()
    step = report.step("ciphertext")
    assert step is not None and step.data["pointer"] != decoy
    withheld = json.loads(net.refs["withheld"].read_text())
    lied.write_text(json.dumps({**withheld, "da_pointer": decoy}))
    assert "da_pointer" not in withheld  # a bare signed receipt: the pointer rides beside it
    report = _auditor(net, chain=False).run(str(lied))
    assert report.verdict.outcome == "cannot_reproduce", report.to_json()
    assert "do not hash to the receipt's ciphertextHash" in report.verdict.reason


def test_oversized_blob_is_not_read_as_the_ciphertext(net: AuditNet,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from verinfer.auditor import sources

    monkeypatch.setattr(sources, "MAX_BLOB_BYTES", 64)  # every real envelope is larger
    report = _auditor(net).run(str(net.refs["greedy"]))
    assert report.verdict.outcome == "cannot_reproduce", report.to_json()
    assert "over the 64 cap" in report.verdict.reason


def test_hostile_reference_files_are_refused_cleanly(net: AuditNet, tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json"
    bomb.write_bytes(b"[" * 95_000 + b"]" * 95_000)
    forged = tmp_path / "forged.json"
    doc = json.loads(net.refs["tampered"].read_text())
    doc["signature"] = "0x" + "11" * 65
    forged.write_text(json.dumps(doc))
    for ref in (str(bomb), str(forged), "0x" + "ab" * 32, "da://local/0x" + "00" * 32,
                str(tmp_path / "absent.json")):
        report = _auditor(net).run(ref)
        assert report.verdict.outcome == "cannot_reproduce", ref
        assert report.verdict.reason.startswith("no valid receipt"), report.verdict.reason


def test_receipt_signed_for_another_domain_is_not_this_chains(net: AuditNet,
                                                              tmp_path: Path) -> None:
    """Validly signed by the staked operator, but for a ChallengeManager that is not this
    chain's: nothing on this chain can slash it, so it is no receipt here."""
    from verinfer.receipts.eip712 import Domain, ReceiptSigner
    from verinfer.testing.evidence import EvidenceFactory, chat_body
    from verinfer.verifier.reexec import engine_for

    dn = net.devnet
    honest = dn.unsafe_operator_factory(engine_for(net.model))
    other = EvidenceFactory(honest.engine, ReceiptSigner(dn.roles.operator.key),
                            Domain(dn.deployment.chain_id, "0x" + "22" * 20), key_epoch=1,
                            epoch_public_key=honest.epoch_public_key)
    ev = other.honest(chat_body("elsewhere", max_tokens=4, seed=3))
    ref = tmp_path / "elsewhere.json"
    ref.write_text(json.dumps(ev.signed.to_json()))
    report = _auditor(net).run(str(ref))
    assert report.verdict.outcome == "cannot_reproduce", report.to_json()
    assert "not for this chain" in report.verdict.reason


def test_hostile_transcript_and_key_files_are_refused(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json"
    bomb.write_bytes(BOMB)
    for load in (load_transcript, load_app_key):
        with pytest.raises(AuditInputError, match="not acceptable JSON"):
            load(bomb)
    junk = tmp_path / "junk.json"
    cases: list[tuple[Any, Any]] = [
        (load_transcript, {"format": "verinfer-transcript/v1", "exec_request": "0x00",
                           "exec_result": "0x00", "request_body": "{}",
                           "response_body": "{}"}),
        (load_transcript, ["not", "an", "object"]),
        (load_app_key, {"suite": "p256-hkdf-sha256-aes128gcm", "secret": "0x" + "00" * 32}),
        (load_app_key, {"suite": "no-such-suite", "secret": "0x" + "01" * 32}),
    ]
    for load, doc in cases:
        junk.write_text(json.dumps(doc))
        with pytest.raises(AuditInputError):
            load(junk)
    # a client transcript whose answer carries no verinfer evidence
    junk.write_text(json.dumps({"request": {}, "response": {"choices": [{"text": "x"}]}}))
    transcript = load_transcript(junk)
    assert not isinstance(transcript, EnvelopeContents)
    with pytest.raises(AuditInputError, match="not a verinfer answer"):
        transcript.results()
