"""The committee node read the chain's whole event history at every step (issue 31, fresh eyes).

``ChainView.opened()`` asked for every ChallengeOpened from the deployment block to "latest"
at each ``VerifierNode.step``, and ``ChainView.batch()`` (every judgement) for every
BatchCommitted ever — each event carrying the operator's daPointer, an unbounded string. Two
ways that broke every honest member at once:

- **RPC range limits.** Public RPCs refuse an eth_getLogs range over 10,000 blocks (some
  2,000). Once the chain was 10,000 blocks past the deployment (~1.4 days on L1) every step
  raised: no draw, no commit, no reveal — each honest member drawn paid the non-reveal penalty
  and every fraud ended Inconclusive. No attacker needed.
- **Junk batches.** A cheating operator commits batches with long daPointers (one transaction
  each, ~2-3 M gas per 100 KB). Once the history's answer passes the node's RPC answer cap
  (``RPC_MAX_ANSWER_BYTES``, 32 MiB: about 160 such batches, or a few weeks of honest ones)
  every judgement was a local fault, retried until the commit window closed: the member never
  voted, was penalised, and the cheater's fraud ended Inconclusive.

Now the node reads ChallengeOpened incrementally in 2,000-block ranges and a challenged batch
from the one block the BatchRegistry recorded for it. Real anvil, real HTTP: the range limit is
a loopback proxy that refuses wide eth_getLogs the way public providers do; the answer cap is
the node's own bounded provider, scaled down (1 MiB for 32 MiB, ~1.2 MB of junk).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.anvil import Anvil, dev_accounts, increase_time
from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.rpc import bounded_web3
from verinfer.chain.signing import sign_receipt_typed
from verinfer.chain.structs import (
    COVERAGE_NOTICE,
    ETHER,
    INVALID_EVIDENCE,
    Kind,
    Role,
    VoteState,
    default_params,
)
from verinfer.da_client.local import LocalDAClient
from verinfer.protocol.hexutil import parse_hex
from verinfer.receipts.eip712 import Domain, Receipt
from verinfer.receipts.merkle import build_tree
from verinfer.testing.chain_clock import MiningNode
from verinfer.verifier.chain_view import ChainView
from verinfer.verifier.node import NodeConfig, VerifierNode
from verinfer.verifier.votes import Verdict

pytestmark = [pytest.mark.anvil, pytest.mark.process, pytest.mark.loopback]

MODEL = hashlib.sha256(b"history model").digest()
FINGERPRINT = hashlib.sha256(b"history fingerprint").digest()
#: blocks per eth_getLogs the proxy serves: public providers enforce 10,000 or fewer (some 500);
#: scaled down here (mining 10,000 blocks takes minutes on a loaded CI machine), with the node
#: configured for it (ChainView(log_chunk_blocks=...), default LOG_CHUNK_BLOCKS = 2,000)
PROVIDER_MAX_RANGE = 100


class RangeCappedRpc:
    """A loopback JSON-RPC proxy in front of anvil that refuses eth_getLogs over more than
    ``max_range`` blocks (the error public providers answer) and forwards everything else."""

    def __init__(self, upstream: str, max_range: int = PROVIDER_MAX_RANGE) -> None:
        self.upstream, self.max_range = upstream, max_range
        self.refused = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = proxy._answer(json.loads(body))
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.client = httpx.Client(timeout=30)

    def _head(self) -> int:
        r = self.client.post(self.upstream, json={"jsonrpc": "2.0", "id": 0,
                                                  "method": "eth_blockNumber", "params": []})
        return int(r.json()["result"], 16)

    def _block(self, tag: Any) -> int:
        if tag in (None, "latest", "pending", "safe", "finalized"):
            return self._head()
        return 0 if tag == "earliest" else int(tag, 16)

    def _answer(self, req: Any) -> Any:
        if isinstance(req, list):
            return [self._answer(r) for r in req]
        if req.get("method") == "eth_getLogs":
            q = req["params"][0]
            if "blockHash" not in q:
                lo, hi = self._block(q.get("fromBlock")), self._block(q.get("toBlock"))
                if hi - lo + 1 > self.max_range:
                    self.refused += 1
                    return {"jsonrpc": "2.0", "id": req.get("id"),
                            "error": {"code": -32005, "message":
                                      f"query exceeds max block range {self.max_range}"}}
        return self.client.post(self.upstream, json=req).json()

    def __enter__(self) -> RangeCappedRpc:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.client.close()


def _never_judge(receipt: Receipt, pointer: str | None, **kw: object) -> Verdict:
    raise AssertionError("the judge ran although the manifest is absent")


@pytest.fixture
def chain() -> Iterator[tuple[Anvil, Deployment, list[LocalAccount]]]:
    with Anvil() as node:
        w3 = node.web3()
        accts = dev_accounts(4)  # governance, operator (cheating), challenger, verifier
        d = deploy_all(w3, accts[0], default_params())
        gov = d.bind(w3, TxSender(w3, accts[0]))
        gov.config.approve(Kind.MODEL, MODEL)
        gov.config.approve(Kind.ENGINE_FINGERPRINT, FINGERPRINT)
        gov.config.register_key_epoch(1, b"\x04" * 32, b"\x11" * 32, 2, 3)
        d.bind(w3, TxSender(w3, accts[1])).stakes.register(Role.OPERATOR, 5 * ETHER)
        verifier = d.bind(w3, TxSender(w3, accts[3]))
        verifier.stakes.register(Role.VERIFIER, ETHER)
        verifier.stakes.declare_fingerprint(FINGERPRINT, MODEL)
        increase_time(w3, COVERAGE_NOTICE)
        yield node, d, accts


def _commit_and_open(w3: Web3, d: Deployment, operator: LocalAccount,
                     challenger: LocalAccount) -> int:
    """The operator commits a batch of one receipt and never publishes its manifest; the
    challenger opens a challenge on it. Returns the challenge id."""
    domain = Domain(d.chain_id, d.challenge_manager)
    now = int(w3.eth.get_block("latest")["timestamp"])
    receipt = Receipt(operator=operator.address, chain_id=d.chain_id, model_id=MODEL,
                      engine_fingerprint_hash=FINGERPRINT,
                      req_hash=hashlib.sha256(b"req").digest(),
                      out_hash=hashlib.sha256(b"out").digest(), key_epoch=1,
                      ciphertext_hash=hashlib.sha256(b"ct").digest(), issued_at=now)
    tree = build_tree([receipt.digest(domain)])
    op: Contracts = d.bind(w3, TxSender(w3, operator))
    op.batches.commit_batch(tree.root, 1, "da://local/0x" + hashlib.sha256(b"m").hexdigest())
    ch: Contracts = d.bind(w3, TxSender(w3, challenger))
    proof = tree.proof(0)
    ch.challenges.open_challenge(receipt, sign_receipt_typed(receipt, domain, operator),
                                 tree.root, proof.index, list(proof.siblings),
                                 default_params().challenge_bond)
    return int(ch.challenges.contract.functions.challengeCount().call())


def _vote_until_committed(w3: Web3, node: VerifierNode, cid: int, c: Contracts,
                          me: str) -> None:
    """Steps the node as its daemon does; with a quarter of the commit window left the absent
    manifest is the operator's fault (``absent_is_final``), so an honest node commits
    INVALID_EVIDENCE."""
    info = c.challenges.challenge(cid)
    now = int(w3.eth.get_block("latest")["timestamp"])
    increase_time(w3, info.commit_deadline - default_params().commit_period // 4 - now)
    for _ in range(4):
        node.step()
        if c.challenges.vote(cid, me).state is VoteState.COMMITTED:
            break
    assert c.challenges.vote(cid, me).state is VoteState.COMMITTED, node.stats.errors[-3:]
    assert parse_hex(node._state[str(cid)]["vote"], 32, "vote") == INVALID_EVIDENCE


def test_node_votes_on_a_chain_older_than_the_rpc_log_range(
        chain: tuple[Anvil, Deployment, list[LocalAccount]], tmp_path: Path) -> None:
    """A chain older (in blocks since the deployment) than the RPC's eth_getLogs range limit
    (10,000 blocks on public providers: under 2 days on L1; scaled to 100 here): the node
    still draws and votes (before: every step raised "query exceeds max block range", so it
    never drew, committed or revealed)."""
    anvil, d, accts = chain
    _, operator, challenger, verifier = accts
    w3 = anvil.web3()
    w3.provider.make_request("anvil_mine", [hex(3 * PROVIDER_MAX_RANGE)])  # type: ignore[arg-type]
    cid = _commit_and_open(w3, d, operator, challenger)
    with RangeCappedRpc(anvil.url) as rpc:
        pw3 = bounded_web3(rpc.url)
        c = d.bind(pw3, TxSender(pw3, verifier))
        view = ChainView(pw3, d, d.bind(pw3), log_chunk_blocks=PROVIDER_MAX_RANGE)
        node = MiningNode(view, c, verifier, _never_judge,
                          LocalDAClient(tmp_path / "da"),
                          NodeConfig(tmp_path / "votes.json", resolve=False,
                                     claim_rewards=False, retry_initial_s=0.0))
        node.step()  # mines to the draw block
        node.step()  # draws
        assert c.challenges.vote(cid, verifier.address).state is VoteState.MEMBER, \
            node.stats.errors[-3:]
        _vote_until_committed(w3, node, cid, c, verifier.address)
        assert rpc.refused == 0


def test_junk_batches_do_not_silence_the_committee(
        chain: tuple[Anvil, Deployment, list[LocalAccount]], tmp_path: Path) -> None:
    """The cheating operator commits 12 junk batches with 100 KB daPointers (~1.2 MB of
    events, 2.4 MB as JSON hex) before its fraud's batch; the node's RPC answers are capped at
    1 MiB (scaled down from RPC_MAX_ANSWER_BYTES = 32 MiB, about 160 such batches). The honest
    member still judges the challenged batch and commits (before: every judgement died on the
    answer cap as a local fault, and the member was penalised for not voting)."""
    anvil, d, accts = chain
    _, operator, challenger, verifier = accts
    w3 = anvil.web3()
    op: Contracts = d.bind(w3, TxSender(w3, operator))
    for i in range(12):
        op.batches.commit_batch(hashlib.sha256(b"junk %d" % i).digest(), 1,
                                "da://local/0x" + "ab" * 50_000)
    cid = _commit_and_open(w3, d, operator, challenger)
    cw3 = bounded_web3(anvil.url, max_answer_bytes=1 << 20)
    c = d.bind(cw3, TxSender(cw3, verifier))
    node = MiningNode(ChainView(cw3, d, d.bind(cw3)), c, verifier, _never_judge,
                      LocalDAClient(tmp_path / "da"),
                      NodeConfig(tmp_path / "votes.json", resolve=False, claim_rewards=False,
                                 retry_initial_s=0.0))
    node.step()
    node.step()
    assert c.challenges.vote(cid, verifier.address).state is VoteState.MEMBER, \
        node.stats.errors[-3:]
    _vote_until_committed(w3, node, cid, c, verifier.address)
