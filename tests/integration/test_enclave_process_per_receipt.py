"""The verifier's ``process`` enclave mode on a per-receipt (P-256) epoch, against five real
shard processes: the SoftwareEnclave child opens the challenged receipt through t partial
decryptions (no epoch key anywhere) and runs the real re-execution job on it. Before, process
mode asked for the epoch key, raised EnclaveError, and the node retried forever (an abstention
by another name).

Also: a verifier holding two models judges a receipt of either (the request's model id picks
the engine; the child loads only that one), and one holding neither abstains instead of
retrying; a receipt that is not under the member's challenge gets nothing from the shards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from verinfer.da_client.local import LocalDAClient
from verinfer.devnet.network import CODE_HASH, CONTAINER_DIGEST, enclave_measurement
from verinfer.enclave.errors import KeyReleaseError
from verinfer.engine.engine import Engine
from verinfer.engine.tiny import write_tiny_llama
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.local_cluster import ClusterLayout, ShardProcesses, provision
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, load_public_key
from verinfer.testing.evidence import Evidence, EvidenceFactory, chat_body
from verinfer.verifier.enclave_judge import EnclaveConfig, EnclaveJudge
from verinfer.verifier.errors import CannotJudgeError
from verinfer.verifier.votes import Verdict

DOMAIN = Domain(31337, "0x" + "cc" * 20)


@dataclass
class World:
    lay: ClusterLayout
    member: LocalAccount
    a: Evidence  # tiny model seed 0, under challenge cA
    b: Evidence  # tiny model seed 1, under challenge cB
    outsider: Evidence  # seed 0, under no challenge
    model0: Path
    model1: Path

    def judge(self, *models: Path) -> EnclaveJudge:
        cfg = EnclaveConfig(self.lay.root_key, self.lay.directory, self.lay.registry,
                            CONTAINER_DIGEST, CODE_HASH, models[0], mode="process",
                            more_models=tuple(models[1:]))
        return EnclaveJudge(cfg, self.member, LocalDAClient(self.lay.root / "da"))


def _judge(j: EnclaveJudge, ev: Evidence, challenge: str) -> Verdict:
    """The enclave step of EnclaveJudge.judge on the ciphertext (DA fetching and the hash
    check before it are not the point here)."""
    return j._judge_in_enclave(ev.signed.receipt, ev.blob, "full_challenge", challenge)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("process-per-receipt")
    model0 = write_tiny_llama(tmp / "tiny0.gguf", seed=0)
    model1 = write_tiny_llama(tmp / "tiny1.gguf", seed=1)
    e0, e1 = Engine.from_path(model0), Engine.from_path(model1)
    member = Account.create()
    lay = provision(tmp / "kms", epoch=1, threshold=3, shares=5,
                    measurements=[enclave_measurement(e0.fingerprint.canonical().decode())],
                    suite=EnvelopeSuite.P256.value, unsafe_single_tree=True)
    rec = FileEpochRegistry(lay.registry).get(1)
    pk = load_public_key(rec.suite, rec.public_key_bytes)
    signer = ReceiptSigner(Account.create().key)

    def factory(e: Engine) -> EvidenceFactory:
        return EvidenceFactory(e, signer, DOMAIN, key_epoch=1, epoch_public_key=pk,
                               now=lambda: 1_700_000_000)

    a = factory(e0).honest(chat_body("per receipt a", max_tokens=3, seed=1))
    b = factory(e1).honest(chat_body("per receipt b", max_tokens=3, seed=2))
    outsider = factory(e0).honest(chat_body("not challenged", max_tokens=3, seed=3))
    e0.close()
    e1.close()
    lay.committee.write_text(json.dumps({
        "verifiers": [member.address],
        "challenges": {
            "cA": {"status": "open", "committee": [member.address],
                   "receipt_hash": "0x" + a.signed.receipt.struct_hash.hex()},
            "cB": {"status": "open", "committee": [member.address],
                   "receipt_hash": "0x" + b.signed.receipt.struct_hash.hex()}}}))
    with ShardProcesses(lay, extra_args=["--rate-capacity", "100"]) as procs:
        procs.start()
        yield World(lay, member, a, b, outsider, model0, model1)


def test_process_mode_judges_per_receipt_epochs_with_the_requests_model(world: World) -> None:
    j = world.judge(world.model0, world.model1)
    va = _judge(j, world.a, "cA")
    vb = _judge(j, world.b, "cB")  # the second model, picked by the request's model id
    for v, ev in ((va, world.a), (vb, world.b)):
        assert v.reason == "match" and v.agrees, v
        assert v.vote == ev.signed.receipt.out_hash


def test_process_mode_without_the_model_abstains_rather_than_retrying(world: World) -> None:
    with pytest.raises(CannotJudgeError, match="not one of this verifier's models"):
        _judge(world.judge(world.model0), world.b, "cB")


def test_process_mode_gets_nothing_for_a_receipt_outside_its_challenge(world: World) -> None:
    with pytest.raises(KeyReleaseError, match="0 valid partial decryptions, need 3"):
        _judge(world.judge(world.model0), world.outsider, "cA")
