"""Issue 17: the image digest is part of the approved engine fingerprint.

Attacks:
* an operator signs under a fingerprint governance never approved (its own image, another
  kernel build): whatever it answered, the signed receipt alone slashes it when a challenge
  opens — on anvil with the real contracts (ProtocolConfig approvals, BatchRegistry,
  ChallengeManager), no committee. An approved fingerprint's receipt is not slashed there.
* an operator approving its own image with its own key: refused (approvals are governance's;
  `operator init --approve-image-key-env` takes the governance key of a devnet/test chain).
* a verifier running another image digest than the receipt's must not vote: its bits may
  differ for honest work, so its vote could slash an honest operator. The real re-execution
  job abstains (CannotJudgeError; the node logs it), also through the enclave job entry.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from verinfer.chain.anvil import Anvil
from verinfer.chain.deploy import deploy_all
from verinfer.chain.structs import Kind, Status
from verinfer.da_client.local import LocalDAClient
from verinfer.devnet.network import (
    bind,
    deploy_network,
    devnet_params,
    epoch_public_key,
    provision_kms,
    register_epoch,
    register_verifiers,
    roles,
)
from verinfer.engine.engine import Engine
from verinfer.engine.fingerprint import local_fingerprint
from verinfer.engine.loader import LoadedModel
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.receipts.merkle import build_tree
from verinfer.testing.evidence import Evidence, EvidenceFactory, chat_body
from verinfer.verifier.errors import CannotJudgeError
from verinfer.verifier.reexec import judge, verify_receipt_job

OTHER_IMAGE = "sha256:" + "5e" * 32  # an image governance never approved
BODY = chat_body("which image ran me?", max_tokens=4, seed=3)


@pytest.fixture
def rogue_engine(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    """The same weights and kernels, run in another image: only the digest differs."""
    eng = Engine(tiny_loaded, "invariant", max_seqs=4, max_batch_tokens=48)
    eng.fingerprint = dataclasses.replace(eng.fingerprint, container_digest=OTHER_IMAGE)
    yield eng
    eng.close()


def _commit_and_open(w3: object, d: object, r: object, ev: Evidence) -> int:
    """The operator commits a one-receipt batch; a challenger opens a challenge on it."""
    root = build_tree([ev.digest]).root
    bind(w3, d, r.operator).batches.commit_batch(root, 1, "da://local/0x" + "00" * 32)  # type: ignore[arg-type, attr-defined]
    proof = build_tree([ev.digest]).proof(0)
    c = bind(w3, d, r.challenger)  # type: ignore[arg-type, attr-defined]
    return c.challenges.open_challenge(ev.signed.receipt, ev.signed.signature, root,
                                       proof.index, proof.siblings,
                                       devnet_params().challenge_bond)


def test_receipt_under_an_unapproved_image_is_slashed_at_challenge_open(
        tiny_engine: Engine, rogue_engine: Engine, tmp_path: Path) -> None:
    assert rogue_engine.fingerprint.hash != tiny_engine.fingerprint.hash
    with Anvil() as node:
        w3 = node.web3()
        r = roles(1)
        d = deploy_network(w3, r, tiny_engine, devnet_params())  # approves tiny_engine's only
        # covers it
        register_verifiers(w3, d, r, [(tiny_engine.fingerprint.hash, tiny_engine.model_id)])
        gov = bind(w3, d)
        assert not gov.config.is_approved(
            Kind.ENGINE_FINGERPRINT, rogue_engine.fingerprint.hash)
        rec = register_epoch(w3, d, r, provision_kms(tmp_path / "kms", tiny_engine))

        def factory(engine: Engine) -> EvidenceFactory:
            return EvidenceFactory(engine, ReceiptSigner(r.operator.key),
                                   Domain(d.chain_id, d.challenge_manager), key_epoch=1,
                                   epoch_public_key=epoch_public_key(rec),
                                   now=lambda: w3.eth.get_block("latest")["timestamp"])

        LocalDAClient(tmp_path / "da")  # the operator's store exists; nothing is withheld
        rogue = factory(rogue_engine).honest(BODY)  # the right answer, the wrong image
        honest = factory(tiny_engine).honest(BODY)
        assert rogue.signed.receipt.out_hash == honest.signed.receipt.out_hash
        stake_before = gov.stakes.account_of(r.operator.address).stake

        cid = _commit_and_open(w3, d, r, rogue)
        info = gov.challenges.challenge(cid)
        assert info.status is Status.SLASHED and info.members == 0
        assert gov.challenges.receipt_slashed(rogue.digest)
        assert (stake_before - gov.stakes.account_of(r.operator.address).stake
                == devnet_params().slash_amount)

        # the control: the approved image's receipt for the same answer goes to a committee
        cid_ok = _commit_and_open(w3, d, r, honest)
        ok = gov.challenges.challenge(cid_ok)
        assert ok.status is not Status.SLASHED
        assert not gov.challenges.receipt_slashed(honest.digest)


SK, PK = derive_epoch_keypair(b"\x07" * 32, EnvelopeSuite.X25519)


def _evidence(engine: Engine) -> Evidence:
    f = EvidenceFactory(engine, ReceiptSigner(b"\x11" * 32),
                        Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3"),
                        key_epoch=1, epoch_public_key=PK, now=lambda: 1_800_000_000)
    return f.honest(BODY)


def test_verifier_on_another_image_abstains(tiny_engine: Engine, rogue_engine: Engine,
                                            tiny_path: Path) -> None:
    theirs = _evidence(rogue_engine)  # an operator in the other (approved elsewhere) image
    with pytest.raises(CannotJudgeError, match="engine fingerprint") as e:
        judge(tiny_engine, theirs.signed.receipt, theirs.blob, SK)
    assert e.value.code == "cannot_judge"
    assert "0x" + rogue_engine.fingerprint.hash.hex() in e.value.message
    # the enclave job entry (what EnclaveJudge's child runs) abstains, it does not vote
    out = verify_receipt_job(SK, receipt=theirs.signed.receipt.to_json(), blob=theirs.blob,
                             model_path=str(tiny_path))
    assert set(out) == {"abstain"} and "engine fingerprint" in out["abstain"]
    # the control: a verifier in the same image judges (and the answer reproduces)
    mine = _evidence(tiny_engine)
    assert judge(tiny_engine, mine.signed.receipt, mine.blob, SK).reason == "match"
    assert judge(rogue_engine, theirs.signed.receipt, theirs.blob, SK).reason == "match"


def _init(directory: Path, dep: Path, url: str, key_env: str, key: str
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(directory),
                           "--light-kdf", "--unsafe-dev", "--rpc-url", url, "--deployment",
                           str(dep), "--approve-image-key-env", key_env],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, key_env: key})


def test_operator_init_approves_its_own_image_only_with_the_governance_key(
        tmp_path: Path) -> None:
    """`operator init --approve-image-key-env` approves the fingerprint of the image it runs
    in (here the host: container none). The operator's own key cannot: approvals are
    governance's (Ownable), and a refused init leaves no operator directory behind."""
    r = roles(1)
    with Anvil() as node:
        w3 = node.web3()
        d = deploy_all(w3, r.governance, devnet_params())
        dep = tmp_path / "deployment.json"
        d.save(dep)
        mine = local_fingerprint()
        item = mine.hash
        refused = _init(tmp_path / "self", dep, node.url, "VI_T_KEY", r.operator.key.hex())
        assert refused.returncode == 2 and "0x" + item.hex() in refused.stderr, refused.stderr
        assert not (tmp_path / "self").exists()
        assert not bind(w3, d).config.is_approved(Kind.ENGINE_FINGERPRINT, item)

        ok = _init(tmp_path / "op", dep, node.url, "VI_T_KEY", r.governance.key.hex())
        assert ok.returncode == 0, ok.stderr
        out = json.loads(ok.stdout.strip().splitlines()[-1])
        assert out["engine_fingerprint_hash"] == "0x" + item.hex()
        assert out["container_digest"] == mine.container_digest == "none"
        assert bind(w3, d).config.is_approved(Kind.ENGINE_FINGERPRINT, item)
        assert (tmp_path / "op" / "operator.json").exists()
