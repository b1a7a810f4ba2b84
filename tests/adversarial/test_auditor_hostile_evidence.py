"""Attacks on `verinfer reproduce` that need no chain: the receipt names its own domain, its
ciphertext lies in a local DA store and the auditor holds the epoch's app key (or a client's
transcript). The auditor must end every hostile input in "mismatch" (exit 1) or "cannot
reproduce" (exit 2) with a reason -- never a traceback, whose exit status (1) reads as
"mismatch": an accusation of an operator who may have done nothing wrong.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from eth_account import Account

from verinfer.auditor.material import AppKey, load_transcript
from verinfer.auditor.reproduce import AuditConfig, Auditor
from verinfer.da_client.local import LocalDAClient
from verinfer.engine.engine import Engine
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import derive_epoch_keypair
from verinfer.testing.evidence import Evidence, EvidenceFactory, chat_body, request_for_body

DOMAIN = Domain(31337, "0x" + "cd" * 20)
OPERATOR = Account.from_key(b"\x07" * 32)
SEED = b"\x00" * 31 + b"\x05"  # a valid P-256 scalar
EPOCH_KEY, EPOCH_PUB = derive_epoch_keypair(SEED, "p256-hkdf-sha256-aes128gcm")
#: deeper than any parser's recursion allows (the stdlib decoder recurses per bracket)
BOMB = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def factory(tiny_engine: Engine) -> EvidenceFactory:
    return EvidenceFactory(tiny_engine, ReceiptSigner(OPERATOR.key), DOMAIN, key_epoch=1,
                           epoch_public_key=EPOCH_PUB)


def _publish(ev: Evidence, tmp_path: Path) -> tuple[Path, LocalDAClient]:
    """The receipt as a file the auditor is handed, its ciphertext on a local DA store."""
    da = LocalDAClient(tmp_path / "da")
    da.put(ev.blob)
    ref = tmp_path / "receipt.json"
    ref.write_text(json.dumps(ev.signed.to_json()))
    return ref, da


def _audit(tiny_path: Path, ref: Path, da: LocalDAClient, **cfg: object) -> Auditor:
    config = AuditConfig(models=[str(tiny_path)], da_backends=["local"], **cfg)  # type: ignore[arg-type]
    return Auditor(config, da=da)


def test_fingerprint_nesting_bomb_does_not_crash_the_auditor(
        factory: EvidenceFactory, tiny_path: Path, tmp_path: Path) -> None:
    """The operator signs (and seals) an ExecRequest whose engine fingerprint string is 100k
    nested brackets. The auditor parsed that string with the unbounded stdlib decoder: a
    RecursionError (a SIGSEGV where eth-account has raised the recursion limit), i.e. a
    traceback and exit status 1 instead of a verdict. Who gains: an operator whose receipt no
    auditor can check, at the cost of one receipt no verifier would judge in its favour (the
    fingerprint is not approved). Now: the string is read with the bounded parser, and a
    fingerprint that is no fingerprint JSON cannot be reproduced here (exit 2)."""
    body = chat_body("hello", max_tokens=3, seed=1)
    request = dataclasses.replace(request_for_body(factory.engine, body),
                                  engine_fingerprint=BOMB)
    gen = factory.engine.generate(list(request.prompt_token_ids), request.sampling_params())
    ev = factory._finish(body, request, ExecResult.from_generation(gen), gen.text)
    ref, da = _publish(ev, tmp_path)
    report = _audit(tiny_path, ref, da, app_key=AppKey(EPOCH_KEY, 1)).run(str(ref))
    assert report.verdict.outcome == "cannot_reproduce", report.to_json()
    assert "engine_fingerprint" in report.verdict.reason


@pytest.mark.parametrize("content", [5, ["a", "list"], {"an": "object"}, True])
def test_client_transcript_with_non_text_content_is_refused_not_a_crash(
        factory: EvidenceFactory, tiny_path: Path, tmp_path: Path, content: object) -> None:
    """Whoever hands the auditor a client transcript puts a number, list or object where the
    answer's text belongs. ``ClientTranscript.results`` called ``.encode()`` on it: an
    AttributeError escaped the step's error handling, a traceback with exit status 1 --
    "mismatch" about an honest operator's receipt. Who gains: a client (or a middleman) who
    wants an honest operator reported as a cheat, at no cost. Now: the transcript is refused
    as the auditor's own unusable input (cannot reproduce)."""
    body = chat_body("hello", max_tokens=3, seed=1)
    ev = factory.honest(body)
    ref, da = _publish(ev, tmp_path)
    request = request_for_body(factory.engine, body)
    gen = factory.engine.generate(list(request.prompt_token_ids), request.sampling_params())
    res = ExecResult.from_generation(gen)
    choice = {"message": {"role": "assistant", "content": content},
              "finish_reason": res.finish_reason,
              "verinfer": {"output_token_ids": list(res.output_token_ids),
                           "logit_digest": "0x" + res.logit_digest.hex()}}
    path = tmp_path / "transcript.json"
    path.write_text(json.dumps({"request": json.loads(body),
                                "response": {"choices": [choice]}}))
    report = _audit(tiny_path, ref, da, transcript=load_transcript(path)).run(str(ref))
    assert report.verdict.outcome == "cannot_reproduce", report.to_json()
    assert "not a verinfer answer" in report.verdict.reason


def test_an_auditor_fault_is_cannot_reproduce_never_exit_1(
        factory: EvidenceFactory, tiny_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever input still finds a bug in the auditor's own code (here the replay raising
    an IndexError, as an engine fault on a hostile request would), the run ends in "cannot
    reproduce" (exit 2): an uncaught exception exits 1, which a script reads as "mismatch", so
    each unfound bug would be a way to have an honest operator reported as a cheat."""
    from verinfer.auditor import reproduce

    ev = factory.honest(chat_body("hello", max_tokens=3, seed=1))
    ref, da = _publish(ev, tmp_path)

    def broken(*args: object, **kwargs: object) -> None:
        raise IndexError("an engine fault")

    monkeypatch.setattr(reproduce, "recompute", broken)
    report = _audit(tiny_path, ref, da, app_key=AppKey(EPOCH_KEY, 1)).run(str(ref))
    assert report.verdict.outcome == "cannot_reproduce", report.to_json()
    assert report.verdict.exit_code == 2
    assert "IndexError" in report.verdict.reason
    monkeypatch.undo()
    honest = _audit(tiny_path, ref, da, app_key=AppKey(EPOCH_KEY, 1)).run(str(ref))
    assert honest.verdict.outcome == "reproduced", honest.to_json()  # the control


def test_a_crash_outside_the_steps_exits_2_not_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule for what runs before the steps (reading the inputs, wiring the chain
    and DA): `verinfer reproduce` let any non-verinfer exception out as a traceback, and the
    interpreter's exit status for that is 1 -- "mismatch"."""
    from typer.testing import CliRunner

    from verinfer.auditor import cli

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a fault before the first step")

    monkeypatch.setattr(cli, "_run", broken)
    result = CliRunner().invoke(cli.app, ["0x" + "ab" * 32])
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "cannot reproduce: the auditor failed (RuntimeError" in result.output
