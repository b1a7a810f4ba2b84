"""The verified client end to end: anvil with the contracts, a staked operator running the
real `verinfer serve` bound to that chain, and VerifiedOpenAI / AsyncVerifiedOpenAI (the
official openai SDK underneath) over loopback. Honest answers — chat and completions, streamed
and not, n > 1 — pass every check with the chain reads cached; a cheating operator (the cheat
factory's answers, signed with the same staked key, served over HTTP) is refused by the check
that names each tamper: text, request, signature, chain id, model, issuedAt.

The receipt keeper, last (it moves anvil's clock by hours, which the answers above — signed on
the wall clock, their model approvals read at issuedAt — must not see): an honest answer kept
by VerifiedOpenAI is followed by the keeper's background task through pending -> batched (the
operator's real batch, proof checked against the committed root) -> available (its
ciphertext on the operator's DA) -> final (the clock moved past the challenge window); an
answer the operator signed and never published (the cheat factory, the operator's key) is
claimed by `verinfer client watch` once its deadline passed and resolved after the response
period: the operator is slashed, the claimant credited, `verinfer client status --json` shows
it. The honest one runs first: once the clock jumped, the operator's next batch would be
committed after a wall-clock receipt's deadline."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.client_evidence import Answer, cheating_operator, resigned
from support.servers import operator_init, running_server
from verinfer.chain.anvil import dev_accounts, increase_time
from verinfer.chain.deploy import Deployment
from verinfer.chain.structs import ClaimStatus
from verinfer.client import (
    AsyncVerifiedOpenAI,
    ClientModel,
    Keeper,
    KeeperPolicy,
    Policy,
    ReceiptStore,
    Received,
    State,
    VerificationError,
    VerificationWarning,
    VerifiedOpenAI,
    Verifier,
)
from verinfer.client.chain_view import ChainView
from verinfer.da_client.local import LocalDAClient
from verinfer.engine.engine import Engine
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, EpochPrivateKey, derive_epoch_keypair
from verinfer.testing.client_chain import ClientChain, client_chain
from verinfer.testing.evidence import EvidenceFactory
from verinfer.testing.hostile import HostilePeer

pytestmark = [pytest.mark.anvil, pytest.mark.process, pytest.mark.loopback]

CHAT: dict[str, Any] = {"model": "tiny", "max_tokens": 6,
                        "messages": [{"role": "user", "content": "tell me about the sea"}]}


@dataclass
class Net:
    chain: ClientChain
    base: str  # the honest operator's URL
    model: ClientModel
    op_dir: Path  # the operator's directory: its local DA store is op_dir / "da"

    def client(self, base: str | None = None, **kw: Any) -> VerifiedOpenAI:
        return VerifiedOpenAI(base_url=(base or self.base + "/v1"), api_key="unused",
                              max_retries=0, models=[self.model],
                              rpc_url=self.chain.node.url,
                              deployment=self.chain.deployment_file, chain_id=31337, **kw)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory, tiny_path: Path, tiny_engine: Engine
        ) -> Iterator[Net]:
    tmp = tmp_path_factory.mktemp("client")
    with client_chain(tmp) as chain, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPERATOR_KEY", chain.operator.key.hex())
        operator_init(tmp / "op", "--private-key-env", "OPERATOR_KEY", "--rpc-url",
                      chain.node.url, "--deployment", str(chain.deployment_file))
        with running_server(tiny_path, "--operator-dir", str(tmp / "op"),
                            env=dict(os.environ)) as base:
            health = httpx.get(base + "/health").json()
            chain.approve(bytes.fromhex(health["model_id"][2:]),
                          bytes.fromhex(health["engine_fingerprint"]["hash"][2:]))
            # the cheating operator's in-process engine
            chain.approve(tiny_engine.model_id,
                          hashlib.sha256(tiny_engine.fingerprint.canonical()).digest())
            deadline = time.monotonic() + 60
            while not httpx.get(base + "/health").json()["ready"]:
                assert time.monotonic() < deadline, httpx.get(base + "/health").json()
                time.sleep(0.2)
            yield Net(chain, base, ClientModel.from_gguf(tiny_path, names=["tiny"]), tmp / "op")


def test_honest_answers_pass_every_check(net: Net) -> None:
    client = net.client()
    r = client.chat.completions.create(**CHAT, seed=3)
    assert r.choices[0].message.content is not None
    reads = client.verification.verifier.chain.reads
    assert reads >= 5  # chain id, operator, two approvals, coverage (+ key epoch)
    r2 = client.chat.completions.create(**CHAT, seed=3)
    assert r2.choices[0].message.content == r.choices[0].message.content
    assert client.verification.verifier.chain.reads == reads  # cached
    c = client.completions.create(model="tiny", prompt="The keeper of the light",
                                  max_tokens=6, seed=7)
    assert c.choices[0].text
    many = client.chat.completions.create(**CHAT, n=2, temperature=1.0, seed=9)
    assert len(many.choices) == 2
    streamed = "".join(ch.choices[0].delta.content or "" for ch in
                       client.chat.completions.create(**CHAT, seed=3, stream=True)
                       if ch.choices)
    assert streamed == r.choices[0].message.content
    inc = net.client(policy=Policy(stream="incremental"))
    text = "".join(ch.choices[0].text for ch in inc.completions.create(
        model="tiny", prompt="The keeper of the light", max_tokens=6, seed=7, stream=True)
        if ch.choices)
    assert text == c.choices[0].text


def test_the_async_client_checks_the_same(net: Net) -> None:
    async def run() -> tuple[str, str]:
        client = AsyncVerifiedOpenAI(base_url=net.base + "/v1", api_key="unused",
                                     max_retries=0, models=[net.model],
                                     rpc_url=net.chain.node.url,
                                     deployment=net.chain.deployment_file)
        r = await client.chat.completions.create(**CHAT, seed=4)
        parts = [ch.choices[0].delta.content or ""
                 async for ch in await client.chat.completions.create(**CHAT, seed=4,
                                                                     stream=True)
                 if ch.choices]
        return r.choices[0].message.content or "", "".join(parts)
    whole, streamed = asyncio.run(run())
    assert whole and whole == streamed


# ---- a cheating operator ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def cheater(net: Net, tiny_engine: Engine) -> tuple[EvidenceFactory, EpochPrivateKey]:
    sk, pk = derive_epoch_keypair(hashlib.sha256(b"client e2e epoch").digest(),
                                  EnvelopeSuite.X25519)
    signer = ReceiptSigner(bytes(net.chain.operator.key))
    return EvidenceFactory(tiny_engine, signer, net.chain.domain, key_epoch=1,
                           epoch_public_key=pk, now=time.time), sk


def _answers(f: EvidenceFactory) -> dict[str, tuple[Answer, str]]:
    """tamper -> (how the cheating operator answers a body, the check that must refuse it)"""
    stranger = ReceiptSigner(hashlib.sha256(b"a stranger").digest())
    other_chain = EvidenceFactory(f.engine, f.signer, Domain(1, f.domain.verifying_contract),
                                  key_epoch=1, epoch_public_key=f.epoch_public_key, now=f.now)
    stale = EvidenceFactory(f.engine, f.signer, f.domain, key_epoch=1,
                            epoch_public_key=f.epoch_public_key, now=lambda: time.time() - 3600)
    return {
        "text": (lambda b: (f.honest(b), "something else"), "output"),
        "request": (lambda b: (f.unsafe_injected_system_prompt(b, "obey me"), None), "request"),
        "seed": (lambda b: (f.unsafe_wrong_seed(b, 12345), None), "request"),
        "signature": (lambda b: (_forged(f.honest(b), stranger), None), "signature"),
        "unstaked_signer": (lambda b: (resigned(f.honest(b), stranger,
                                                operator=stranger.address), None), "operator"),
        "chain_id": (lambda b: (other_chain.honest(b), None), "chain_id"),
        "model": (lambda b: (resigned(f.honest(b), f.signer, model_id=b"\x07" * 32), None),
                  "model"),
        "issued_at": (lambda b: (stale.honest(b), None), "issued_at"),
    }


def _forged(ev: Any, stranger: ReceiptSigner) -> Any:
    from dataclasses import replace
    return replace(ev, signed=replace(ev.signed, signature=stranger.sign_digest(
        ev.signed.receipt.digest(ev.signed.domain))))


def test_the_cheat_factorys_honest_answer_passes(net: Net, cheater: Any) -> None:
    f, sk = cheater
    with cheating_operator(lambda b: (f.honest(b), None), sk) as base:
        r = net.client(base).chat.completions.create(**CHAT, seed=5)
        assert r.choices[0].message.content is not None


@pytest.mark.parametrize("tamper", ["text", "request", "seed", "signature", "unstaked_signer",
                                    "chain_id", "model", "issued_at"])
@pytest.mark.parametrize("stream", [False, True])
def test_each_tamper_raises_its_check(net: Net, cheater: Any, tamper: str,
                                      stream: bool) -> None:
    f, sk = cheater
    answer, check = _answers(f)[tamper]
    with cheating_operator(answer, sk) as base:
        client = net.client(base)
        with pytest.raises(VerificationError) as e:
            out = client.chat.completions.create(**CHAT, seed=5, stream=stream)
            list(out) if stream else None
        assert e.value.check == check, str(e.value)


def test_policies_warn_and_hook_return_the_answer(net: Net, cheater: Any) -> None:
    f, sk = cheater
    seen: list[VerificationError] = []
    with cheating_operator(lambda b: (f.honest(b), "changed"), sk) as base:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = net.client(base, policy=Policy(on_failure="warn")).chat.completions.create(
                **CHAT, seed=5)
        assert r.choices[0].message.content == "changed"
        assert [w.message.error.check for w in caught
                if isinstance(w.message, VerificationWarning)] == ["output"]
        r = net.client(base, policy=Policy(on_failure="hook", hook=seen.append)
                       ).chat.completions.create(**CHAT, seed=5)
        assert r.choices[0].message.content == "changed" and seen[0].check == "output"


def test_an_incremental_stream_raises_before_it_ends(net: Net, cheater: Any) -> None:
    f, sk = cheater
    with cheating_operator(lambda b: (f.honest(b), "changed text"), sk) as base:
        out = net.client(base, policy=Policy(stream="incremental")).chat.completions.create(
            **CHAT, seed=5, stream=True)
        got = []
        with pytest.raises(VerificationError) as e:
            for ch in out:
                got.append(ch)
        assert e.value.check == "output" and got  # chunks passed, then the check refused


def test_a_silent_rpc_fails_closed_within_the_deadline(net: Net, cheater: Any) -> None:
    f, sk = cheater
    ev = f.honest(b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],'
                  b'"max_tokens":2,"seed":1}')
    from support.client_evidence import verification_entry
    v = verification_entry(ev, sk)
    dep = Deployment.load(net.chain.deployment_file)
    with HostilePeer("silent") as rpc:
        verifier = Verifier(ChainView(rpc.url, dep, deadline_s=0.5),
                            {net.model.model_id: net.model})
        t0 = time.monotonic()
        with pytest.raises(VerificationError) as e:
            verifier.verify("chat", ev.request_body, v, [Received(ev.text, None)])
        assert e.value.check == "chain" and time.monotonic() - t0 < 5



def test_with_options_copies_keep_checking(net: Net, cheater: Any) -> None:
    """The SDK's copy / with_options build a new client: it checks as the original did."""
    f, sk = cheater
    with cheating_operator(lambda b: (f.honest(b), "changed"), sk) as base:
        original = net.client(base)
        copied = original.with_options(timeout=60)
        assert isinstance(copied, VerifiedOpenAI)
        assert copied.verification is original.verification
        with pytest.raises(VerificationError) as e:
            copied.chat.completions.create(**CHAT, seed=5)
        assert e.value.check == "output"
    r = net.client().copy(max_retries=0).completions.create(model="tiny", prompt="The sea",
                                                             max_tokens=3, seed=1)
    assert r.choices[0].text is not None


# ---- the receipt keeper (last: it moves the chain's clock) -------------------------------------
VI = [sys.executable, "-m", "verinfer"]


def _chain_time(net: Net) -> int:
    return int(net.chain.node.web3().eth.get_block("latest")["timestamp"])


def _wait_state(store: ReceiptStore, rid: str, want: State, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while store.get(rid).state is not want:
        assert time.monotonic() < deadline, (store.get(rid), store.history(rid))
        time.sleep(0.2)


def test_keeper_follows_an_honest_answer_to_final(net: Net, tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "receipts.sqlite")
    r = net.client(receipts=store).chat.completions.create(**CHAT, seed=11)
    rid = r.model_extra["verification"]["receipt_id"]  # type: ignore[index]
    assert [k.id for k in store.receipts()] == [rid]
    keeper = Keeper.connect(store, net.chain.node.url, net.chain.deployment_file,
                            LocalDAClient(net.op_dir / "da"), account=None,
                            policy=KeeperPolicy(file_claims=False, poll_s=0.2)).start()
    try:
        _wait_state(store, rid, State.AVAILABLE)
        k = store.get(rid)
        assert k.committed_at is not None and k.committed_at <= (k.publish_by or 0)
        assert k.final_after == k.committed_at + 3600 and k.ciphertext
        assert _chain_time(net) <= k.final_after  # the window is open: not final yet
        assert store.get(rid).state is State.AVAILABLE
        increase_time(net.chain.node.web3(), k.final_after - _chain_time(net) + 1)
        _wait_state(store, rid, State.FINAL, timeout_s=30)
    finally:
        keeper.stop(timeout_s=30)
    assert [s for _, s, _ in store.history(rid)] == [State.PENDING, State.BATCHED,
                                                     State.AVAILABLE, State.FINAL]


def _watch_once(net: Net, receipts: Path, key: str) -> dict[str, Any]:
    out = subprocess.run(
        [*VI, "client", "watch", "--once", "--receipts", str(receipts), "--rpc-url",
         net.chain.node.url, "--deployment", str(net.chain.deployment_file), "--da-store",
         str(net.op_dir / "da")], capture_output=True, text=True, timeout=120,
        env={**os.environ, "VERINFER_CHAIN_PRIVATE_KEY": key})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _status(receipts: Path) -> dict[str, Any]:
    out = subprocess.run([*VI, "client", "status", "--json", "--receipts", str(receipts)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_keeper_claims_a_withheld_receipt_and_the_operator_is_slashed(
        net: Net, cheater: Any, tmp_path: Path) -> None:
    f, sk = cheater
    receipts = tmp_path / "receipts.sqlite"
    store = ReceiptStore(receipts)
    with cheating_operator(lambda b: (f.honest(b), None), sk) as base:  # never published
        net.client(base, receipts=store).chat.completions.create(**CHAT, seed=12)
    [k] = store.receipts()
    store.close()
    c = net.chain.bound(net.chain.operator)
    params = c.config.params()
    operator = net.chain.operator.address
    stake0 = c.stakes.account_of(operator).stake
    claimant = dev_accounts(5)[4]
    key = claimant.key.hex()
    w3 = net.chain.node.web3()
    publish_by = k.issued_at + params.publication_deadline
    if _chain_time(net) < publish_by:
        _watch_once(net, receipts, key)
        status = _status(receipts)
        assert status["counts"]["pending"] == 1, status  # its deadline has not passed
        assert status["next_deadline"]["deadline"] == publish_by
        increase_time(w3, publish_by - _chain_time(net) + 1)
    _watch_once(net, receipts, key)  # the deadline passed: the claim is filed
    with ReceiptStore(receipts) as s:
        kept = s.get(k.id)
    assert kept.state is State.CLAIMED and kept.claim_id, kept
    claim = c.challenges.claim(kept.claim_id)
    assert claim.status is ClaimStatus.OPEN and claim.claimant == claimant.address
    assert to_hex(claim.receipt_digest) == k.id
    _watch_once(net, receipts, key)  # within the response period: nothing to do
    assert c.challenges.claim(kept.claim_id).status is ClaimStatus.OPEN
    increase_time(w3, claim.response_deadline - _chain_time(net) + 1)
    _watch_once(net, receipts, key)  # resolveUnpublished
    _watch_once(net, receipts, key)  # reads the claim: slashed
    assert c.challenges.claim(kept.claim_id).status is ClaimStatus.SLASHED
    assert c.challenges.receipt_state(k.signed.digest).unpublished_slashed
    assert c.stakes.account_of(operator).stake == stake0 - params.slash_amount
    assert c.challenges.credits(claimant.address) > params.challenge_bond
    status = _status(receipts)
    assert status["counts"]["slashed"] == 1 and status["next_deadline"] is None, status
    assert [x["receipt"] for x in status["failures"]] == [k.id]
