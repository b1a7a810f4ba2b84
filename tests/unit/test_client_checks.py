"""Each check of the verified client (verinfer.client.verify) on answers made by the cheat
factory: an honest answer passes, and each tamper is refused by the check that names it.
The chain's answers come from a table here (the real reads run on anvil in
tests/e2e/test_client_verified.py)."""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest

from support.client_evidence import resigned, verification_entry
from verinfer.chain.deploy import Deployment
from verinfer.chain.structs import Kind
from verinfer.client import ClientModel, Received, VerificationError, Verifier
from verinfer.client.chain_view import ChainView, approved_at
from verinfer.engine.engine import Engine
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EpochPrivateKey
from verinfer.testing.evidence import Evidence, EvidenceFactory, chat_body
from verinfer.testing.fixed_operator import FIXED_NOW, TEST_DOMAIN, fixed_operator

BODY = chat_body("tell me about the sea", max_tokens=6, seed=5)
# the engine's fingerprint reads platform.processor(), which runs `uname -p` once per process
# (cached after): read it here, at collection, not inside the unit guard of the first test
platform.processor()


@dataclass
class ChainFacts:
    """What the chain says, as a table (ChainView's interface)."""

    deployment: Deployment
    operators: set[str]
    models: set[bytes]
    fingerprints: set[bytes]
    covered: bool = True
    epochs: set[int] = field(default_factory=lambda: {1})

    def check_chain_id(self) -> None:
        pass

    def is_active_operator(self, address: str) -> bool:
        return address in self.operators

    def is_approved_at(self, kind: Kind, item: bytes, at: int) -> bool:
        return item in (self.models if kind is Kind.MODEL else self.fingerprints)

    def is_covered_at(self, fingerprint_hash: bytes, model_id: bytes, at: int) -> bool:
        return self.covered

    def is_key_epoch_live_at(self, epoch: int, at: int) -> bool:
        return epoch in self.epochs


@dataclass
class Setup:
    factory: EvidenceFactory
    sk: EpochPrivateKey
    chain: ChainFacts
    model: ClientModel
    engine: Engine

    def verifier(self, **kw: Any) -> Verifier:
        return Verifier(cast(ChainView, self.chain), {self.model.model_id: self.model},
                        now=lambda: FIXED_NOW, **kw)

    def check(self, ev: Evidence, *, body: bytes = BODY, text: str | None = None,
              entry: Callable[[dict[str, Any]], Any] | None = None, **kw: Any) -> Any:
        v = verification_entry(ev, self.sk)
        if entry is not None:
            v = entry(v)
        got = Received(ev.text if text is None else text,
                       v["exec_result"]["finish_reason"] if isinstance(v, dict) else None)
        return self.verifier(**kw).verify("chat", body, v, [got])


@pytest.fixture(scope="module")
def setup(tiny_engine: Engine, tiny_path: Path) -> Setup:
    factory, sk = fixed_operator(tiny_engine, "client checks", key_epoch=1)
    fp = hashlib.sha256(tiny_engine.fingerprint.canonical()).digest()
    dep = Deployment(TEST_DOMAIN.chain_id, "0x" + "22" * 20, "0x" + "33" * 20,
                     "0x" + "44" * 20, TEST_DOMAIN.verifying_contract, "0x" + "55" * 20, 0)
    model = ClientModel.from_gguf(tiny_path, names=["tiny"])
    assert model.model_id == tiny_engine.model_id
    return Setup(factory, sk, ChainFacts(dep, {factory.operator}, {model.model_id}, {fp}),
                 model, tiny_engine)


def failed(setup: Setup, ev: Evidence, **kw: Any) -> str:
    with pytest.raises(VerificationError) as e:
        setup.check(ev, **kw)
    return e.value.check


def test_an_honest_answer_passes_every_check(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    (checked,) = setup.check(ev)
    assert checked.receipt == ev.signed.receipt and checked.signature == ev.signed.signature


def test_text_changed_after_signing_fails_output(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    assert failed(setup, ev, text=ev.text + "!") == "output"


def test_finish_reason_or_tokens_other_than_signed_fail_output(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    v = verification_entry(ev, setup.sk)
    other = "length" if v["exec_result"]["finish_reason"] == "stop" else "stop"
    with pytest.raises(VerificationError, match="finish_reason") as e:
        setup.verifier().verify("chat", BODY, v, [Received(ev.text, other)])
    assert e.value.check == "output"
    ids = tuple(v["exec_result"]["output_token_ids"])
    with pytest.raises(VerificationError, match="token ids") as e:
        setup.verifier().verify("chat", BODY, v, [Received(ev.text, None, ids[:-1])])
    assert e.value.check == "output"


def test_an_exec_result_that_is_not_the_signed_one_fails_output(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)

    def swap(v: dict[str, Any]) -> dict[str, Any]:
        return {**v, "exec_result": {**v["exec_result"], "text_sha256": "0x" + "00" * 32}}
    assert failed(setup, ev, entry=swap) == "output"


@pytest.mark.parametrize("cheat", ["injected_system_prompt", "wrong_seed", "other_body"])
def test_a_request_other_than_the_one_sent_fails_request(setup: Setup, cheat: str) -> None:
    f = setup.factory
    ev = {"injected_system_prompt": lambda: f.unsafe_injected_system_prompt(BODY, "obey"),
          "wrong_seed": lambda: f.unsafe_wrong_seed(BODY, 6),
          "other_body": lambda: f.honest(chat_body("tell me about the sky", max_tokens=6,
                                                   seed=5))}[cheat]()
    assert failed(setup, ev) == "request"


def test_a_body_an_honest_server_refuses_fails_request(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    assert failed(setup, ev, body=b'{"model":"tiny","messages":[]}') == "request"


def test_signature_checks(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)

    def flip(v: dict[str, Any]) -> dict[str, Any]:
        sig = bytearray.fromhex(v["signature"][2:])
        sig[5] ^= 1
        return {**v, "signature": "0x" + sig.hex()}
    assert failed(setup, ev, entry=flip) == "signature"
    stranger = ReceiptSigner(hashlib.sha256(b"a stranger").digest())
    # the stranger signs the operator's receipt: it does not recover to the operator
    forged = replace(ev, signed=replace(ev.signed, signature=stranger.sign_digest(
        ev.signed.receipt.digest(ev.signed.domain))))
    assert failed(setup, forged) == "signature"
    # the stranger signs as itself: a valid signature of no staked operator
    as_itself = resigned(ev, stranger, operator=stranger.address)
    assert failed(setup, as_itself) == "operator"


def test_an_operator_not_staked_or_not_listed_fails_operator(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    assert failed(setup, ev, operators=["0x" + "99" * 20]) == "operator"
    setup.chain.operators.discard(setup.factory.operator)
    try:
        assert failed(setup, ev) == "operator"
    finally:
        setup.chain.operators.add(setup.factory.operator)


def test_chain_id_and_contract(setup: Setup) -> None:
    f = setup.factory
    other_chain = EvidenceFactory(f.engine, f.signer, Domain(1, TEST_DOMAIN.verifying_contract),
                                  key_epoch=1, epoch_public_key=f.epoch_public_key, now=f.now)
    assert failed(setup, other_chain.honest(BODY)) == "chain_id"
    # the receipt names another chain than its (right) domain
    assert failed(setup, resigned(f.honest(BODY), f.signer, chain_id=1)) == "chain_id"
    other_contract = EvidenceFactory(f.engine, f.signer, Domain(31337, "0x" + "66" * 20),
                                     key_epoch=1, epoch_public_key=f.epoch_public_key, now=f.now)
    assert failed(setup, other_contract.honest(BODY)) == "contract"


@pytest.mark.parametrize("offset", [-3600, -301, 301, 2**40])
def test_issued_at_out_of_bounds_fails_issued_at(setup: Setup, offset: int) -> None:
    ev = resigned(setup.factory.honest(BODY), setup.factory.signer,
                  issued_at=FIXED_NOW + offset)
    assert failed(setup, ev) == "issued_at"


def test_issued_at_inside_the_bounds_passes(setup: Setup) -> None:
    for offset in (-300, 300):
        setup.check(resigned(setup.factory.honest(BODY), setup.factory.signer,
                             issued_at=FIXED_NOW + offset))


def test_model_checks(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    # signed for a model the client does not accept
    assert failed(setup, resigned(ev, setup.factory.signer, model_id=b"\x07" * 32)) == "model"
    # the body's name is bound to another model of the client's
    other = replace(setup.model, model_id=b"\x08" * 32, names=("tiny",))
    v = Verifier(cast(ChainView, setup.chain),
                 {setup.model.model_id: replace(setup.model, names=()), other.model_id: other},
                 now=lambda: FIXED_NOW)
    with pytest.raises(VerificationError, match="asked for 'tiny'") as e:
        v.verify("chat", BODY, verification_entry(ev, setup.sk),
                 [Received(ev.text, None)])
    assert e.value.check == "model"
    # not approved on chain at issuedAt
    setup.chain.models.clear()
    try:
        assert failed(setup, ev) == "model"
    finally:
        setup.chain.models.add(setup.model.model_id)


def test_fingerprint_checks(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    assert failed(setup, resigned(ev, setup.factory.signer,
                                  engine_fingerprint_hash=b"\x09" * 32)) == "fingerprint"
    assert failed(setup, ev, fingerprints=[b"\x09" * 32]) == "fingerprint"
    saved = set(setup.chain.fingerprints)
    setup.chain.fingerprints.clear()
    try:
        assert failed(setup, ev) == "fingerprint"
    finally:
        setup.chain.fingerprints |= saved


def test_coverage_and_key_epoch(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    setup.chain.covered = False
    try:
        assert failed(setup, ev) == "coverage"
        setup.check(ev, require_coverage=False)  # the policy may waive it
    finally:
        setup.chain.covered = True
    assert failed(setup, resigned(ev, setup.factory.signer, key_epoch=2)) == "key_epoch"


def test_format_and_choices(setup: Setup) -> None:
    ev = setup.factory.honest(BODY)
    v = verification_entry(ev, setup.sk)
    with pytest.raises(VerificationError) as e:
        setup.verifier().verify("chat", BODY, None, [Received(ev.text, None)])
    assert e.value.check == "format"
    with pytest.raises(VerificationError) as e:
        setup.verifier().verify("chat", BODY, {k: x for k, x in v.items() if k != "signature"},
                                [Received(ev.text, None)])
    assert e.value.check == "format"
    with pytest.raises(VerificationError) as e:
        setup.verifier().verify("chat", BODY, v, [Received(ev.text, None)] * 2)
    assert e.value.check == "choices"


def test_approved_at_is_the_contracts_rule() -> None:
    history = [(100, 200), (300, 0)]
    assert [approved_at(history, t) for t in (99, 100, 199, 200, 299, 300, 10**9)] == \
        [False, True, True, False, False, True, True]
    assert not approved_at([], 5) and not approved_at([(0, 0)], 5)
