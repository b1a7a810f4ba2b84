"""The adversary, the honest parties' turn, and the invariants checked after every step.

An episode is a sequence of actions chosen by a seeded adversary (``choose``); each action is a
JSON-able dict with every choice resolved (ids, amounts, salts), so a trace replays exactly
(``replay``). After every action the honest parties get their turn when the adversary moves
the clock (they are live: they act before each deadline), and the invariants are checked
(``Checker``). A broken invariant is a ``Violation`` carrying the seed, the episode and the trace.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from eth_utils import keccak, to_checksum_address

from verinfer.chain.bindings import receipt_tuple
from verinfer.chain.structs import (
    ETHER,
    INVALID_EVIDENCE,
    ChallengeInfo,
    ClaimInfo,
    ClaimStatus,
    Kind,
    Params,
    Status,
    pool_key,
)
from verinfer.errors import VerinferError
from verinfer.receipts.eip712 import MAX_ISSUED_AT_SKEW_S
from verinfer.testing.game.rpc import Rpc, RpcError, abi_functions
from verinfer.testing.game.world import (
    CONTRACTS,
    FINGERPRINT,
    KEY_EPOCH,
    MODEL,
    Issued,
    World,
    true_out,
)
from verinfer.verifier.challenger import FUTURE_MARGIN_S, Challenger, Located

BPS = 10_000
UINT128_MAX = (1 << 128) - 1
UINT256_MAX = (1 << 256) - 1
LIVE = (Status.AWAITING_DRAW, Status.VOTING)
#: How long before a deadline the clock stops for the honest parties' turn (each of their
#: transactions takes one one-second block).
LEAD_S = 30
#: An honest party's margin before a deadline it must meet (its transaction is mined in a
#: later block than the head it read).
MARGIN_S = 3


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str
    seed: int
    episode: int
    step: int
    trace: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "seed": self.seed,
                "episode": self.episode, "step": self.step, "trace": self.trace}

    def __str__(self) -> str:
        return (f"violation {self.kind} (seed {self.seed}, episode {self.episode}, step "
                f"{self.step}): {self.detail}\ntrace: {json.dumps(self.trace)}")


# ---- the adversary's choices ------------------------------------------------------------

SERVE_MODES = ("publish", "no_blobs", "no_manifest", "unpublished", "late", "future",
               "dated_after_commit", "bad_model", "invalid_evidence_out")
TIME_STEPS = (1, 30, 299, 300, 301, 599, 600, 601, 1200, 3600, 3601, 86_400)


def _pick_weighted(rng: random.Random, table: list[tuple[str, float]]) -> str:
    total = sum(w for _, w in table)
    x = rng.random() * total
    for name, w in table:
        x -= w
        if x <= 0:
            return name
    return table[-1][0]


ACTION_WEIGHTS: list[tuple[str, float]] = [
    ("serve_honest", 6), ("serve_cheat", 6), ("cheat_commit_pending", 2), ("cheat_answer", 2),
    ("sybil_commit", 8), ("sybil_reveal", 6), ("grief_challenge", 3), ("grief_claim", 2),
    ("front_run", 2), ("sybil_bond", 4), ("stake", 6), ("governance", 2), ("fuzz", 10),
    ("time", 10),
    ("mine", 2), ("tick", 3),
]


class Game:
    """One world, played by episodes."""

    def __init__(self, world: World, *, governance: bool = True) -> None:
        self.w = world
        self.governance = governance
        #: who the honest challenger is this episode: a party of its own, or an honest
        #: verifier that caught the fraud (then its own committee may exclude it)
        self.hc = "challenger"
        self.base_params = self._params()

    # ---- reads ------------------------------------------------------------------------------

    def _params(self) -> Params:
        return Params.from_tuple(self.w.view("ProtocolConfig", "params")[0])

    def _known_ids(self, kind: str) -> int:
        fn = "challengeCount" if kind == "challenge" else "claimCount"
        return int(self.w.view("ChallengeManager", fn)[0])

    # ---- choosing -----------------------------------------------------------------------------

    def choose(self, rng: random.Random, state: Checker) -> dict[str, Any]:
        w, ep = self.w, self.w.ep
        assert ep is not None
        kind = _pick_weighted(rng, [(k, x) for k, x in ACTION_WEIGHTS
                                    if self.governance or k != "governance"])
        a: dict[str, Any] = {"a": kind}
        sybil = f"sybil{rng.randrange(len(w.sybils))}"
        honest_items = [i for i in ep.issued.values() if i.by == "honest_op"]
        cheats = [i for i in ep.issued.values() if i.by == "cheat_op"]
        if kind == "serve_honest":
            a["k"] = rng.randint(1, 3)
        elif kind == "serve_cheat":
            a["k"] = rng.randint(1, 3)
            a["mode"] = rng.choice(SERVE_MODES)
            a["wrong"] = [rng.random() < 0.7 for _ in range(a["k"])]
        elif kind == "cheat_answer":
            a["claim"] = rng.randint(1, max(1, state.claim_count + 1))
            a["garbage"] = rng.random() < 0.3
        elif kind == "sybil_bond":
            a["sybil"] = sybil
            # 0.9 ETH: a minimum-stake sybil then weighs exactly what an honest verifier does
            a["value"] = rng.choice((ETHER * 9 // 10, ETHER * 9 // 10, ETHER * 4 // 10,
                                     ETHER * 19 // 10, ETHER * 49 // 10, ETHER * 99 // 10))
        elif kind in ("sybil_commit", "sybil_reveal"):
            seats = sorted((cid, n) for cid, info in state.live_challenges.items()
                           if info.status is Status.VOTING
                           for n in w.attacker_names if n.startswith("sybil")
                           and any(x == w.address(n) for x, _ in state.committees.get(cid, [])))
            if seats and rng.random() < 0.85:
                a["cid"], sybil = rng.choice(seats)
            else:
                a["cid"] = rng.randint(1, max(1, state.challenge_count + 1))
            a["sybil"] = sybil
            # colluding sybils mostly shield the cheater's receipt
            a["value"] = rng.choice(("receipt", "receipt", "receipt", "truth", "invalid",
                                     "random"))
            a["salt"] = "0x" + rng.randbytes(32).hex()
            a["skip"] = rng.random() < 0.15  # a reveal that never comes
        elif kind in ("grief_challenge", "grief_claim"):
            if not honest_items:
                return {"a": "tick"}
            # by its place in issue order, so a trace replays on other contracts too
            a["nth"] = rng.randrange(len(honest_items))
            a["by"] = rng.choice(w.attacker_names)
        elif kind == "front_run":
            if not cheats:
                return {"a": "tick"}
            a["nth"] = rng.randrange(len(cheats))
            a["by"] = rng.choice(w.attacker_names)
        elif kind == "stake":
            a["by"] = rng.choice(w.attacker_names)
            a["op"] = rng.choice(("bond", "bond_big", "requestUnbond", "withdraw",
                                  "declareFingerprint", "undeclareFingerprint",
                                  "completeUndeclare", "syncWeight", "syncParams",
                                  "withdrawCredits", "register"))
            a["amount"] = rng.choice((0, 1, ETHER // 20, ETHER // 10, ETHER, 5 * ETHER,
                                      UINT128_MAX))
            a["target"] = rng.choice(w.party_names)
        elif kind == "governance":
            a["op"] = rng.choice(("setParams", "setParams", "approve", "revoke",
                                  "registerKeyEpoch", "retireKeyEpoch"))
            a["variant"] = rng.randrange(1 << 30)
        elif kind == "fuzz":
            a.update(self._fuzz_call(rng, state))
        elif kind == "time":
            a["s"] = rng.choice(TIME_STEPS)
        elif kind == "mine":
            a["n"] = rng.choice((1, 2, 3, 257))
        return a

    def _fuzz_call(self, rng: random.Random, state: Checker) -> dict[str, Any]:
        """Any state-changing function of any contract, from an attacker, with arguments drawn
        from boundary values and the ids, digests and addresses in play."""
        contract = rng.choice(CONTRACTS)
        fns = [f for f in abi_functions(contract).values()
               if f.mutability in ("nonpayable", "payable")]
        f = rng.choice(fns)
        args = [self._fuzz_value(rng, p, state) for p in f.inputs]
        value = rng.choice((0, 0, 1, self.base_params.challenge_bond, ETHER)) \
            if f.mutability == "payable" else 0
        return {"contract": contract, "fn": f.name, "args": _jsonable(args), "value": value,
                "by": rng.choice(self.w.attacker_names)}

    def _fuzz_value(self, rng: random.Random, p: dict[str, Any], state: Checker) -> Any:
        t = p["type"]
        ep = self.w.ep
        assert ep is not None
        if t.endswith("[]"):
            inner = dict(p, type=t[:-2])
            return [self._fuzz_value(rng, inner, state) for _ in range(rng.choice((0, 1, 2)))]
        if t == "tuple" and [c["name"] for c in p["components"]][:2] != ["version", "operator"]:
            return tuple(self._fuzz_value(rng, c, state) for c in p["components"])
        if t == "tuple":  # the Receipt: a real one, maybe with one field changed
            items = list(ep.issued.values())
            if items and rng.random() < 0.8:
                r = list(receipt_tuple(rng.choice(items).receipt))
            else:
                r = [1, self.w.address("honest_op"), self.w.d.chain_id, MODEL, FINGERPRINT,
                     b"\x01" * 32, b"\x02" * 32, KEY_EPOCH, b"\x03" * 32, 0]
            if rng.random() < 0.5:
                k = rng.randrange(len(r))
                r[k] = self._fuzz_value(rng, p["components"][k], state)
            return tuple(r)
        if t == "address":
            return rng.choice([self.w.address(n) for n in self.w.party_names]
                              + list(self.w.addr.values()) + ["0x" + "00" * 20])
        if t == "bool":
            return rng.random() < 0.5
        if t.startswith("uint"):
            bits = int(t[4:] or 256)
            return rng.choice((0, 1, 2, 3, state.challenge_count, state.challenge_count + 1,
                               state.claim_count, rng.randrange(1 << 16), ETHER // 10,
                               (1 << bits) - 1, (1 << (bits - 1)))) % (1 << bits)
        if t == "bytes32":
            digests = list(ep.issued)
            roots = [i.root for i in ep.issued.values() if i.root][-4:]
            return rng.choice([b"\x00" * 32, MODEL, FINGERPRINT, INVALID_EVIDENCE,
                               rng.randbytes(32), *digests[-4:], *roots])
        if t == "bytes":
            sigs = [i.signed.signature for i in ep.issued.values()][-4:]
            return rng.choice([b"", b"\x04" * 65, rng.randbytes(65), *sigs])
        if t == "string":
            return rng.choice(("", "da://local/0x" + "ab" * 32))
        if t.startswith("int"):
            return rng.choice((0, -1, 1))
        raise ValueError(f"fuzz: no generator for ABI type {t}")

    # ---- executing ------------------------------------------------------------------------------

    def execute(self, a: dict[str, Any], state: Checker) -> str:
        """Runs one action; returns a short outcome for the trace ("ok" or the revert)."""
        try:
            return getattr(self, "_do_" + a["a"])(a, state) or "ok"
        except RpcError as e:
            return f"revert {e}"

    def _now(self) -> int:
        return self.w.head()[1]

    def _do_tick(self, a: dict[str, Any], state: Checker) -> str:
        self.honest_turn(state)
        return "ok"

    def _do_serve_honest(self, a: dict[str, Any], state: Checker) -> str:
        w = self.w
        now = self._now()
        # the operator signs only what the chain would accept as valid (operator/readiness.py)
        pool = pool_key(FINGERPRINT, MODEL)
        ok = (bool(w.view("StakeRegistry", "isActiveOperator", [w.address("honest_op")])[0])
              and bool(w.view("StakeRegistry", "isCoveredAt", [pool, now])[0])
              and bool(w.view("ProtocolConfig", "isReceiptConfigValid",
                              [MODEL, FINGERPRINT, KEY_EPOCH, now])[0]))
        if not ok:
            return "refused (not active, uncovered or config invalid)"
        items = [w.make_receipt("honest_op", issued_at=now) for _ in range(a["k"])]
        w.honest_commit(items)
        return "ok"

    def _do_serve_cheat(self, a: dict[str, Any], state: Checker) -> str:
        w, ep = self.w, self.w.ep
        assert ep is not None
        now = self._now()
        mode = a["mode"]
        p = self._params()
        issued_at = {"future": now + MAX_ISSUED_AT_SKEW_S + 1 + (a["k"] * 97),
                     "dated_after_commit": now + MAX_ISSUED_AT_SKEW_S + 5,
                     "late": now - p.publication_deadline - 1}.get(mode, now)
        items = []
        for k in range(a["k"]):
            out = None if not a["wrong"][k] else keccak(b"wrong" + bytes([k]) + now.to_bytes(8))
            if mode == "invalid_evidence_out":
                out = INVALID_EVIDENCE
            items.append(w.make_receipt(
                "cheat_op", out=out, issued_at=issued_at,
                model=keccak(b"other model") if mode == "bad_model" else MODEL))
            # invalid on its face, or its evidence withheld from a committed batch: a fraud
            # whatever its output (withheld or late receipts are claims' business)
            if mode in ("future", "dated_after_commit", "no_blobs", "no_manifest"):
                items[-1].fraud = True
        if mode in ("unpublished", "future"):
            ep.pending.setdefault("cheat", []).extend(items)
            return "withheld"
        root, ptr = w.publish(items, blobs=mode != "no_blobs", manifest=mode != "no_manifest")
        w.tx("cheat_op", "BatchRegistry", "commitBatch", [root, len(items), str(ptr)])
        for i in items:
            i.committed_at = self._now()
        return "committed"

    def _do_cheat_commit_pending(self, a: dict[str, Any], state: Checker) -> str:
        ep = self.w.ep
        assert ep is not None
        items = ep.pending.get("cheat", [])
        if not items:
            return "nothing pending"
        root, ptr = self.w.publish(items)
        self.w.tx("cheat_op", "BatchRegistry", "commitBatch", [root, len(items), str(ptr)])
        ep.pending.pop("cheat")
        for i in items:
            i.committed_at = self._now()
        return "committed late"

    def _do_cheat_answer(self, a: dict[str, Any], state: Checker) -> str:
        ep = self.w.ep
        assert ep is not None
        cl = ClaimInfo.from_tuple(self.w.view("ChallengeManager", "claim", [a["claim"]])[0])
        it = ep.issued.get(bytes(cl.receipt_digest))
        if a["garbage"] or it is None or it.proof is None or it.root is None:
            root = it.root if it and it.root else b"\x00" * 32
            self.w.tx("cheat_op", "ChallengeManager", "answerUnpublished",
                      [a["claim"], root, 0, []])
        else:
            self.w.tx("cheat_op", "ChallengeManager", "answerUnpublished",
                      [a["claim"], it.root, it.proof.index, list(it.proof.siblings)])
        return "ok"

    def _vote_value(self, a: dict[str, Any], info: ChallengeInfo) -> bytes:
        ep = self.w.ep
        assert ep is not None
        it = ep.issued.get(bytes(info.receipt_digest))
        return {"receipt": bytes(info.receipt_out_hash), "invalid": INVALID_EVIDENCE,
                "truth": true_out(it.receipt.req_hash) if it else INVALID_EVIDENCE,
                "random": keccak(bytes.fromhex(a["salt"][2:]))}[a["value"]]

    def _do_sybil_commit(self, a: dict[str, Any], state: Checker) -> str:
        info = ChallengeInfo.from_tuple(self.w.view("ChallengeManager", "challenge",
                                                    [a["cid"]])[0])
        value = self._vote_value(a, info)
        state.sybil_votes[(a["cid"], a["sybil"])] = (value, a["salt"], a["skip"])
        commitment = self.w.view("ChallengeManager", "voteCommitment",
                                 [a["cid"], self.w.address(a["sybil"]), value,
                                  bytes.fromhex(a["salt"][2:])])[0]
        self.w.tx(a["sybil"], "ChallengeManager", "commitVote", [a["cid"], commitment])
        return f"committed {a['value']}"

    def _do_sybil_reveal(self, a: dict[str, Any], state: Checker) -> str:
        got = state.sybil_votes.get((a["cid"], a["sybil"]))
        if got is None:
            return "no vote"
        value, salt, skip = got
        if skip:
            return "withholds"
        self.w.tx(a["sybil"], "ChallengeManager", "revealVote",
                  [a["cid"], value, bytes.fromhex(salt[2:])])
        return "revealed"

    def _open(self, by: str, it: Issued) -> str:
        if it.root is None or it.proof is None:
            return "not committed"
        bond = self._params().challenge_bond
        self.w.tx(by, "ChallengeManager", "openChallenge",
                  [receipt_tuple(it.receipt), it.signed.signature, it.root, it.proof.index,
                   list(it.proof.siblings)], value=bond)
        return "opened"

    def _nth(self, by: str, n: int) -> Issued | None:
        ep = self.w.ep
        assert ep is not None
        items = [i for i in ep.issued.values() if i.by == by]
        return items[n] if n < len(items) else None

    def _do_grief_challenge(self, a: dict[str, Any], state: Checker) -> str:
        it = self._nth("honest_op", a["nth"])
        return "no such receipt" if it is None else self._open(a["by"], it)

    def _do_front_run(self, a: dict[str, Any], state: Checker) -> str:
        it = self._nth("cheat_op", a["nth"])
        return "no such receipt" if it is None else self._open(a["by"], it)

    def _do_grief_claim(self, a: dict[str, Any], state: Checker) -> str:
        it = self._nth("honest_op", a["nth"])
        if it is None:
            return "no such receipt"
        self.w.tx(a["by"], "ChallengeManager", "claimUnpublished",
                  [receipt_tuple(it.receipt), it.signed.signature],
                  value=self._params().challenge_bond)
        return "claimed"

    def _do_sybil_bond(self, a: dict[str, Any], state: Checker) -> str:
        self.w.tx(a["sybil"], "StakeRegistry", "bond", [], value=a["value"])
        return "bonded"

    def _do_stake(self, a: dict[str, Any], state: Checker) -> str:
        by, op, amount = a["by"], a["op"], a["amount"]
        target = self.w.address(a["target"])
        if op in ("bond", "bond_big"):
            value = max(1, amount % (10**21)) * (10 if op == "bond_big" else 1)
            self.w.tx(by, "StakeRegistry", "bond", [], value=min(value, 500 * ETHER))
        elif op == "requestUnbond":
            self.w.tx(by, "StakeRegistry", "requestUnbond", [amount])
        elif op == "withdraw":
            self.w.tx(by, "StakeRegistry", "withdraw", [])
        elif op in ("declareFingerprint", "undeclareFingerprint"):
            self.w.tx(by, "StakeRegistry", op, [FINGERPRINT, MODEL])
        elif op == "completeUndeclare":
            self.w.tx(by, "StakeRegistry", op, [target, FINGERPRINT, MODEL])
        elif op == "syncWeight":
            self.w.tx(by, "StakeRegistry", op, [target])
        elif op == "syncParams":
            self.w.tx(by, "StakeRegistry", op, [])
        elif op == "withdrawCredits":
            self.w.tx(by, "ChallengeManager", op, [])
        elif op == "register":
            self.w.tx(by, "StakeRegistry", op, [amount % 3], value=min(amount, 50 * ETHER))
        return "ok"

    def _do_governance(self, a: dict[str, Any], state: Checker) -> str:
        rng = random.Random(a["variant"])
        op = a["op"]
        if op == "setParams":
            p = self.base_params
            scale = rng.choice((0.5, 1, 1, 2))
            new = replace(p,
                challenge_window=int(p.challenge_window * rng.choice((0.5, 1, 2))),
                publication_deadline=int(p.publication_deadline * scale),
                response_period=int(p.response_period * scale),
                draw_delay_blocks=rng.choice((1, 2, 5)),
                committee_size=rng.choice((1, 3, 3, 5)),
                quorum_bps=rng.choice((5001, 6667, 6667, 7500, 10_000)),
                challenger_reward_bps=rng.choice((0, 2000, 5000)),
                draw_period=int(p.draw_period * scale), commit_period=int(p.commit_period * scale),
                reveal_period=int(p.reveal_period * scale),
                unbonding_period=p.unbonding_period * rng.choice((1, 2)),
                challenge_bond=rng.choice((ETHER // 10, ETHER // 100)),
                slash_amount=rng.choice((ETHER // 2, ETHER, 2 * ETHER)),
                non_reveal_penalty=rng.choice((ETHER // 20, ETHER // 10)),
                min_operator_stake=rng.choice((ETHER, 2 * ETHER)),
                min_verifier_stake=ETHER // 10,
                majority_reward_bps=rng.choice((0, 3000, 5000)))
            if new.min_operator_stake < new.slash_amount:
                new = replace(new, min_operator_stake=new.slash_amount)
            if hasattr(new, "claim_window"):  # issue 31: claimWindow <= challengeWindow
                new = replace(new, claim_window=min(new.claim_window, new.challenge_window))
            self.w.tx("gov", "ProtocolConfig", "setParams", [new.as_tuple()])
            return "params set"
        ident = rng.choice((MODEL, FINGERPRINT, keccak(b"other model")))
        kind = Kind.MODEL if ident != FINGERPRINT else Kind.ENGINE_FINGERPRINT
        if op in ("approve", "revoke"):
            self.w.tx("gov", "ProtocolConfig", op, [kind, ident])
        elif op == "registerKeyEpoch":
            self.w.tx("gov", "ProtocolConfig", op, [rng.randint(1, 3), b"\x04" * 65,
                                                    b"\x11" * 32, 2, 3])
        else:
            self.w.tx("gov", "ProtocolConfig", op, [rng.randint(1, 3)])
        return op

    def _do_fuzz(self, a: dict[str, Any], state: Checker) -> str:
        f = abi_functions(a["contract"])[a["fn"]]
        self.w.rpc.send(self.w.address(a["by"]), self.w.addr[a["contract"]],
                        f.encode(_from_json(a["args"])), a["value"])
        return "ok"

    def _do_time(self, a: dict[str, Any], state: Checker) -> str:
        self.advance(a["s"], state)
        return "ok"

    def _do_mine(self, a: dict[str, Any], state: Checker) -> str:
        self.w.rpc.req("anvil_mine", [hex(a["n"])])
        return "ok"

    # ---- time and the honest parties -----------------------------------------------------------

    def advance(self, seconds: int, state: Checker) -> None:
        """Moves the clock by ``seconds``. The honest parties are live: the clock stops for
        their turn ``LEAD_S`` before and just after every deadline of a live dispute (and of a
        withheld receipt's publication), so they act inside every phase."""
        _, now = self.w.head()
        end = now + seconds
        while True:
            self.honest_turn(state)
            _, now = self.w.head()
            if now >= end:
                return
            stops = [t for d in self._deadlines(state) for t in (d - LEAD_S, d + 1) if t > now]
            target = min([end, *stops])
            self.w.jump(target - now)

    def _deadlines(self, state: Checker) -> list[int]:
        p = self._params()
        ds: list[int] = []
        for info in state.live_challenges.values():
            if info.status is Status.AWAITING_DRAW:
                ds.append(info.opened_at + p.draw_period)
            else:
                ds += [info.commit_deadline, info.reveal_deadline]
        ds += [cl.response_deadline for cl in state.live_claims.values()]
        ep = self.w.ep
        assert ep is not None
        ds += [i.committed_at + p.challenge_window for i in ep.issued.values()
               if i.by == "cheat_op" and i.fraud and i.committed_at is not None
               and i.digest not in ep.hc_challenges.values()]
        claimed = set(ep.hc_claims.values())
        ds += [i.receipt.issued_at + p.publication_deadline for i in ep.issued.values()
               if i.by == "cheat_op" and i.digest not in claimed
               and (i.committed_at is None
                    or i.committed_at > i.receipt.issued_at + p.publication_deadline)]
        return ds

    def _pending_frauds(self) -> bool:
        ep = self.w.ep
        assert ep is not None
        return bool(ep.pending.get("cheat"))

    def honest_turn(self, state: Checker) -> None:
        """Every honest party acts once on what it sees: the challenger disputes frauds, the
        honest operator answers claims, the verifier nodes step, the keeper settles."""
        state.refresh()
        self._challenger_turn(state)
        self._operator_turn(state)
        for _ in range(3):
            before = self.w.head()[0]
            for node in self.w.ep.nodes:  # type: ignore[union-attr]
                node.step()
            if self.w.head()[0] == before:
                break
        self._keeper_turn(state)

    def _challenger_turn(self, state: Checker) -> None:
        w, ep = self.w, self.w.ep
        assert ep is not None
        c = w.contracts_for(w.account(self.hc))
        ch = Challenger(ep.view, c, ep.da)
        _, now = w.head()
        p = self._params()
        batches: list[Any] | None = None
        for it in list(ep.issued.values()):
            if it.by != "cheat_op":
                continue
            rs = state.receipt_state(it.digest)
            mine = [cid for cid, d in ep.hc_challenges.items() if d == it.digest]
            done = any(state.ended.get(("challenge", cid)) is Status.SLASHED for cid in mine)
            if it.fraud and it.root is not None and it.proof is not None \
                    and it.committed_at is not None and not done and not rs.slashed \
                    and not rs.live_challenge \
                    and now + MARGIN_S <= it.committed_at + p.challenge_window:
                batches = ep.view.batches() if batches is None else batches
                batch = next((b for b in batches if b.root == it.root), None)
                try:
                    _, ident = ch.open(Located(it.signed, batch, it.proof, str(it.pointer)))
                    ep.hc_challenges[ident] = it.digest
                except VerinferError as e:
                    state.violate("required_call_reverted",
                                  f"honest challenger could not open on fraud "
                                  f"0x{it.digest.hex()[:12]}: {e}")
            publish_by = it.receipt.issued_at + p.publication_deadline
            unpublished = it.committed_at is None or it.committed_at > publish_by
            future = it.receipt.issued_at > now + MAX_ISSUED_AT_SKEW_S + FUTURE_MARGIN_S
            claim_by = publish_by + getattr(p, "claim_window", 1 << 64)
            if not unpublished or it.digest in ep.hc_claims.values() or rs.live_claim \
                    or rs.unpublished_slashed or (future and rs.slashed):
                continue
            if future or publish_by < now <= claim_by - MARGIN_S:
                try:
                    _, ident = ch.open(Located(it.signed, None, None, None))
                    ep.hc_claims[ident] = it.digest
                except VerinferError as e:
                    state.violate("required_call_reverted",
                                  f"honest claimant could not claim 0x{it.digest.hex()[:12]}: {e}")

    def _operator_turn(self, state: Checker) -> None:
        """The honest operator's daemons: one publisher step (a batch whose commit failed
        before is retried), one claim-responder step."""
        ep = self.w.ep
        assert ep is not None
        ep.publisher.run_once(flush=True)
        late = [i for i in ep.issued.values() if i.by == "honest_op" and i.root is None]
        for i in late:  # batches committed since: their roots and proofs
            self._read_back(i)
        ep.responder.step()

    def _read_back(self, i: Issued) -> None:
        ep = self.w.ep
        assert ep is not None
        found = ep.outbox.entry_state(i.digest)
        row = None if found is None or found[2] is None else ep.outbox.batch(found[2])
        if row is not None and row.state == "committed":
            from verinfer.da_client.manifest import inclusion_proof
            i.root, i.proof = row.root, inclusion_proof(row.manifest, i.digest)
            b = self.w.view("BatchRegistry", "batchOf", [self.w.address("honest_op"), row.root])
            i.committed_at = int(b[0][1])

    def _keeper_turn(self, state: Checker) -> None:
        """Draws and resolves what is due (anyone may; the honest challenger does)."""
        c = self.w.contracts_for(self.w.account(self.hc))
        state.refresh()
        number, now = self.w.head()
        p = self._params()
        for cid, info in list(state.live_challenges.items()):
            try:
                if info.status is Status.AWAITING_DRAW:
                    if now > info.opened_at + p.draw_period:
                        c.challenges.resolve(cid)
                    elif number > info.target_block:
                        c.challenges.draw_committee(cid)
                elif info.status is Status.VOTING and (
                        info.reveals == info.members or now > info.reveal_deadline):
                    c.challenges.resolve(cid)
            except VerinferError as e:
                state.violate("required_call_reverted", f"keeper on challenge {cid}: {e}")
        for cid, cl in list(state.live_claims.items()):
            if cl.status is ClaimStatus.OPEN and now > cl.response_deadline:
                try:
                    c.challenges.resolve_unpublished(cid)
                except VerinferError as e:
                    state.violate("required_call_reverted", f"keeper on claim {cid}: {e}")
        state.refresh()
        number, now = self.w.head()
        for cid, info in state.live_challenges.items():
            due = info.opened_at + p.draw_period if info.status is Status.AWAITING_DRAW \
                else info.reveal_deadline
            if now > due + 5:
                state.violate("dispute_unbounded", f"challenge {cid} ({info.status.name}) "
                              f"still live {now - due}s after its deadline")
        for cid, cl in state.live_claims.items():
            if now > cl.response_deadline + 5:
                state.violate("dispute_unbounded", f"claim {cid} still open "
                              f"{now - cl.response_deadline}s after its response deadline")


def _jsonable(x: Any) -> Any:
    if isinstance(x, bytes):
        return "0x" + x.hex()
    if isinstance(x, (list, tuple)):
        return {"t": [_jsonable(v) for v in x]} if isinstance(x, tuple) else \
            [_jsonable(v) for v in x]
    return x


def _from_json(x: Any) -> Any:
    if isinstance(x, str) and x.startswith("0x") and len(x) != 42:
        return bytes.fromhex(x[2:])
    if isinstance(x, dict) and "t" in x:
        return tuple(_from_json(v) for v in x["t"])
    if isinstance(x, list):
        return [_from_json(v) for v in x]
    return x


# ---- the invariants -------------------------------------------------------------------------


def promised(seats: Sequence[tuple[str, int]], honest: set[str], tau: int) -> str:
    """Why the params promise that ``seats`` (account, weight) decide a fraud against the
    receipt when every honest seat votes the truth ("" if they do not): (a) the honest weight
    reaches the quorum tau; or (b) one dissenting seat among equals — every seat but one is
    honest and none weighs less than the dissenter, n >= 3 seats — cannot block a verdict
    (tau * n <= (n - 1) * BPS: tau = 2/3 must let 2 of 3 equal members decide; with 2 seats
    no tau > 1/2 can)."""
    total = sum(w for _, w in seats)
    hw = sum(w for a, w in seats if a in honest)
    if total == 0 or hw == 0:
        return ""
    if hw * BPS >= tau * total:
        return f"honest weight {hw} of {total} reaches tau {tau} bps"
    others = [w for a, w in seats if a not in honest]
    if len(others) == 1 and len(seats) >= 3 and \
            all(w >= others[0] for a, w in seats if a in honest):
        return (f"one dissenting seat ({others[0]} wei) among {len(seats)} equal or heavier "
                f"honest seats ({hw} of {total}, {hw * BPS // total} bps; tau {tau} bps)")
    return ""


@dataclass
class Checker:
    """Chain state the invariants need, refreshed in batches, and the checks themselves."""

    game: Game
    seed: int
    episode: int
    trace: list[dict[str, Any]]
    step: int = 0
    challenge_count: int = 0
    claim_count: int = 0
    live_challenges: dict[int, ChallengeInfo] = field(default_factory=dict)
    live_claims: dict[int, ClaimInfo] = field(default_factory=dict)
    committees: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    #: the τ each ended challenge was decided by (fixed at its draw; 0: never drawn)
    taus: dict[int, int] = field(default_factory=dict)
    ended: dict[tuple[str, int], Any] = field(default_factory=dict)
    ended_since_check: list[int] = field(default_factory=list)
    #: honest verifiers penalised for losing to a committee the attacker had captured (its
    #: stake reached the quorum): the price of "outvoted revealers pay", not a violation
    minority_penalties: int = 0
    sybil_votes: dict[tuple[int, str], tuple[bytes, str, bool]] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    start_total: int = 0
    start_stakes: dict[str, int] = field(default_factory=dict)
    start_wealth: dict[str, int] = field(default_factory=dict)

    def violate(self, kind: str, detail: str) -> None:
        self.violations.append(Violation(kind, detail, self.seed, self.episode, self.step,
                                         list(self.trace)))

    @property
    def w(self) -> World:
        return self.game.w

    def receipt_state(self, digest: bytes) -> Any:
        from verinfer.chain.structs import ReceiptState
        return ReceiptState.from_tuple(self.w.view("ChallengeManager", "receiptState",
                                                   [digest])[0])

    def refresh(self) -> None:
        """Reads the new dispute ids and every live dispute; checks each one that ended."""
        w = self.w
        cm = w.addr["ChallengeManager"]
        fns = abi_functions("ChallengeManager")
        n_ch, n_cl = (int(fns[f].decode(bytes.fromhex(r[2:]))[0]) for f, r in zip(
            ("challengeCount", "claimCount"),
            w.rpc.batch([Rpc.call_req(cm, fns["challengeCount"], []),
                         Rpc.call_req(cm, fns["claimCount"], [])]), strict=True))
        ch_ids = sorted(set(self.live_challenges) | set(range(self.challenge_count + 1,
                                                               n_ch + 1)))
        cl_ids = sorted(set(self.live_claims) | set(range(self.claim_count + 1, n_cl + 1)))
        self.challenge_count, self.claim_count = n_ch, n_cl
        reqs = [Rpc.call_req(cm, fns["challenge"], [i]) for i in ch_ids] + \
            [Rpc.call_req(cm, fns["claim"], [i]) for i in cl_ids]
        res = w.rpc.batch(reqs)
        for i, r in zip(ch_ids, res[:len(ch_ids)], strict=True):
            info = ChallengeInfo.from_tuple(fns["challenge"].decode(bytes.fromhex(r[2:]))[0])
            info = replace(info, operator=to_checksum_address(info.operator),
                           challenger=to_checksum_address(info.challenger))
            if info.status is Status.VOTING and i not in self.committees:
                members = w.view("ChallengeManager", "committee", [i])[0]
                self.committees[i] = [(to_checksum_address(m[0]), int(m[1])) for m in members]
            if info.status in LIVE:
                self.live_challenges[i] = info
            else:
                self.live_challenges.pop(i, None)
                self._challenge_ended(i, info)
        for i, r in zip(cl_ids, res[len(ch_ids):], strict=True):
            cl = ClaimInfo.from_tuple(fns["claim"].decode(bytes.fromhex(r[2:]))[0])
            cl = replace(cl, operator=to_checksum_address(cl.operator),
                         claimant=to_checksum_address(cl.claimant))
            if cl.status is ClaimStatus.OPEN:
                self.live_claims[i] = cl
            else:
                self.live_claims.pop(i, None)
                self._claim_ended(i, cl)

    def _challenge_ended(self, cid: int, info: ChallengeInfo) -> None:
        ep = self.w.ep
        assert ep is not None
        self.ended[("challenge", cid)] = info.status
        self.ended_since_check.append(cid)
        key = f"challenge_{info.status.name.lower()}"
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        # the τ fixed at the draw: a later setParams does not change how it was decided
        tau = self.taus[cid] = info.quorum_bps or self.game._params().quorum_bps
        it = ep.issued.get(bytes(info.receipt_digest))
        if it is None or not it.fraud or it.by != "cheat_op":
            return
        members = self.committees.get(cid, [])
        honest = {self.w.address(f"verifier{i}") for i in range(len(self.w.honest_verifiers))}
        why = promised(members, honest, tau)
        if not why:
            why = self._pool_promise(info, honest, tau)
        if info.status is not Status.SLASHED and why:
            self.violate("fraud_not_slashed",
                         f"challenge {cid} on fraud 0x{it.digest.hex()[:12]} (challenger "
                         f"{self.game.hc}) ended {info.status.name}: {why}")

    def _pool_promise(self, info: ChallengeInfo, honest: set[str], tau: int) -> str:
        """When the committee size seats every verifier of the pool at the snapshot, the pool
        is the committee the params promise: its honest share must decide."""
        w = self.w
        blk = info.snapshot_block
        used = int(w.view("StakeRegistry", "poolSlotsUsed", [info.pool])[0])
        fn = abi_functions("StakeRegistry")["poolSlotAt"]
        reqs = [Rpc.call_req(w.addr["StakeRegistry"], fn, [info.pool, k, blk])
                for k in range(1, used + 1)]
        pool = [(to_checksum_address(o), int(x)) for o, x in
                (fn.decode(bytes.fromhex(r[2:])) for r in w.rpc.batch(reqs)) if int(x) > 0]
        size = self.game._params().committee_size
        if not pool or len(pool) > size:
            return ""
        why = promised(pool, honest, tau)
        return f"the whole pool fits the committee ({len(pool)} <= {size}) and {why}" \
            if why else ""

    def _claim_ended(self, cid: int, cl: ClaimInfo) -> None:
        ep = self.w.ep
        assert ep is not None
        self.ended[("claim", cid)] = cl.status
        key = f"claim_{cl.status.name.lower()}"
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        it = ep.issued.get(bytes(cl.receipt_digest))
        if it is None or cid not in ep.hc_claims:
            return
        p = self.game._params()
        on_time = it.committed_at is not None and \
            it.committed_at <= it.receipt.issued_at + p.publication_deadline
        if cl.status is ClaimStatus.ANSWERED and not on_time:
            self.violate("unpublished_not_slashed",
                         f"claim {cid} on 0x{it.digest.hex()[:12]} (committed "
                         f"{it.committed_at}, issued {it.receipt.issued_at}) was answered")

    # ---- money ------------------------------------------------------------------------------

    def _wealth_reads(self) -> tuple[list[str], list[tuple[str, list[Any]]]]:
        w = self.w
        names = w.party_names
        sr, cm = w.addr["StakeRegistry"], w.addr["ChallengeManager"]
        srf, cmf = abi_functions("StakeRegistry"), abi_functions("ChallengeManager")
        reqs: list[tuple[str, list[Any]]] = []
        for n in names:
            reqs.append(("eth_getBalance", [w.address(n), "latest"]))
            reqs.append(Rpc.call_req(sr, srf["accountOf"], [w.address(n)]))
            reqs.append(Rpc.call_req(cm, cmf["credits"], [w.address(n)]))
        extra = [w.coinbase, *w.addr.values()]
        reqs += [("eth_getBalance", [a, "latest"]) for a in extra]
        reqs += [Rpc.call_req(sr, srf["totalStake"], []),
                 Rpc.call_req(cm, cmf["totalCredits"], []),
                 Rpc.call_req(cm, cmf["totalBurnt"], [])]
        return names, reqs

    def money(self) -> dict[str, Any]:
        names, reqs = self._wealth_reads()
        res = self.w.rpc.batch(reqs)
        srf, cmf = abi_functions("StakeRegistry"), abi_functions("ChallengeManager")
        out: dict[str, Any] = {"parties": {}}
        for k, n in enumerate(names):
            bal = int(res[3 * k], 16)
            acct = srf["accountOf"].decode(bytes.fromhex(res[3 * k + 1][2:]))[0]
            cred = int(cmf["credits"].decode(bytes.fromhex(res[3 * k + 2][2:]))[0])
            out["parties"][n] = {"balance": bal, "stake": int(acct[0]), "unbonding": int(acct[1]),
                                 "locked": int(acct[3]), "credits": cred}
        base = 3 * len(names)
        extra = [int(x, 16) for x in res[base:base + 1 + len(self.w.addr)]]
        out["coinbase"], out["contracts"] = extra[0], dict(zip(self.w.addr, extra[1:],
                                                               strict=True))
        tail = res[base + 1 + len(self.w.addr):]
        out["totalStake"] = int(srf["totalStake"].decode(bytes.fromhex(tail[0][2:]))[0])
        out["totalCredits"] = int(cmf["totalCredits"].decode(bytes.fromhex(tail[1][2:]))[0])
        out["totalBurnt"] = int(cmf["totalBurnt"].decode(bytes.fromhex(tail[2][2:]))[0])
        out["total"] = sum(p["balance"] for p in out["parties"].values()) + out["coinbase"] + \
            sum(out["contracts"].values())
        return out

    def begin(self) -> None:
        m = self.money()
        self.start_total = m["total"]
        self.start_stakes = {n: p["stake"] for n, p in m["parties"].items()}
        self.start_wealth = {n: p["balance"] + p["stake"] + p["credits"]
                             for n, p in m["parties"].items()}

    def check(self) -> None:
        """The invariants that hold after every step."""
        self.refresh()
        m = self.money()
        w = self.w
        if m["total"] != self.start_total:
            self.violate("eth_not_conserved", f"sum of balances moved by "
                         f"{m['total'] - self.start_total} wei")
        sr = m["contracts"]["StakeRegistry"]
        if sr != m["totalStake"]:
            self.violate("stake_not_backed", f"StakeRegistry holds {sr}, totalStake "
                         f"{m['totalStake']}")
        bonds = sum(c.bond for c in self.live_challenges.values()) + \
            sum(c.bond for c in self.live_claims.values())
        cm = m["contracts"]["ChallengeManager"]
        if cm != m["totalCredits"] + m["totalBurnt"] + bonds:
            self.violate("credits_not_backed", f"ChallengeManager holds {cm}, credits "
                         f"{m['totalCredits']} + burnt {m['totalBurnt']} + live bonds {bonds}")
        for other in ("ProtocolConfig", "BatchRegistry", "AuditLog"):
            if m["contracts"][other]:
                self.violate("eth_stuck", f"{other} holds {m['contracts'][other]} wei")
        # the honest operator: stake moves only by its own choices; locks only for live disputes
        hop = w.address("honest_op")
        acct = m["parties"]["honest_op"]
        if acct["stake"] != self.start_stakes["honest_op"]:
            self.violate("honest_operator_slashed", f"stake {self.start_stakes['honest_op']} "
                         f"-> {acct['stake']}")
        want = sum(c.locked_stake for c in self.live_challenges.values() if c.operator == hop) \
            + sum(c.locked_stake for c in self.live_claims.values() if c.operator == hop)
        if acct["locked"] != want:
            self.violate("honest_operator_lock", f"locked {acct['locked']}, live disputes hold "
                         f"{want}")
        for i in range(len(w.honest_verifiers)):
            n = f"verifier{i}"
            a = m["parties"][n]
            if a["stake"] != self.start_stakes[n]:
                self._verifier_stake_moved(n, a["stake"])
            me = w.address(n)
            want = sum(c.member_penalty for cid, c in self.live_challenges.items()
                       if c.status is Status.VOTING
                       and any(x == me for x, _ in self.committees.get(cid, [])))
            if a["locked"] != want:
                self.violate("honest_verifier_lock", f"{n} locked {a['locked']}, live "
                             f"committees hold {want}")
        self.ended_since_check.clear()

    def _verifier_stake_moved(self, name: str, stake: int) -> None:
        """An honest verifier's stake fell. A violation unless every challenge that ended
        since the last check with it on the committee was decided by attackers holding the
        quorum against an honest side the params do not promise to win."""
        me = self.w.address(name)
        honest = {self.w.address(f"verifier{i}") for i in range(len(self.w.honest_verifiers))}
        tau = self.game._params().quorum_bps
        mine = [cid for cid in self.ended_since_check
                if any(a == me for a, _ in self.committees.get(cid, []))]
        kept = [cid for cid in mine
                if promised(self.committees[cid], honest, self.taus.get(cid, tau))]
        if not mine or kept or stake > self.start_stakes[name]:
            self.violate("honest_verifier_penalised",
                         f"{name} stake {self.start_stakes[name]} -> {stake} (challenges "
                         f"ended with it seated: {mine}; honest side promised in {kept})")
        else:
            self.minority_penalties += 1
        self.start_stakes[name] = stake

    def payoffs(self) -> dict[str, int]:
        m = self.money()
        return {n: p["balance"] + p["stake"] + p["credits"] - self.start_wealth[n]
                for n, p in m["parties"].items()}


# ---- running ----------------------------------------------------------------------------------


@dataclass
class EpisodeResult:
    seed: int
    episode: int
    trace: list[dict[str, Any]]
    violations: list[Violation]
    outcomes: dict[str, int]
    payoffs: dict[str, int]
    reverts: int
    minority_penalties: int = 0


def play_episode(game: Game, seed: int, episode: int, steps: int,
                 trace: list[dict[str, Any]] | None = None,
                 stop_at_first: bool = True) -> EpisodeResult:
    """Plays ``steps`` adversary actions (or replays ``trace``) from a fresh episode."""
    game.w.reset()
    rng = random.Random(f"verinfer-game:{seed}:{episode}")
    game.hc = rng.choice(("challenger", "verifier0"))
    played: list[dict[str, Any]] = []
    st = Checker(game, seed, episode, played)
    st.begin()
    reverts = 0
    todo = list(trace) if trace is not None else None
    n = len(todo) if todo is not None else steps
    for k in range(n):
        st.step = k
        a = dict(todo[k]) if todo is not None else game.choose(rng, st)
        a.pop("outcome", None)
        played.append(a)  # in the trace before it runs: a violation inside it includes it
        outcome = game.execute(a, st)
        reverts += outcome.startswith("revert")
        a["outcome"] = outcome
        st.check()
        if st.violations and stop_at_first:
            break
    # the end: the honest parties settle everything that is left
    if not (st.violations and stop_at_first):
        st.step = n
        game.advance(_settle_time(game), st)
        st.check()
    return EpisodeResult(seed, episode, played, st.violations, st.outcomes, st.payoffs(),
                         reverts, st.minority_penalties)


def _settle_time(game: Game) -> int:
    p = game._params()
    return p.draw_period + p.commit_period + p.reveal_period + p.response_period + \
        p.publication_deadline + 60


def replay(world: World, trace: list[dict[str, Any]], *, seed: int = 0, episode: int = 0,
           governance: bool = True) -> EpisodeResult:
    """Replays a trace printed with a violation (the outcomes in it are ignored)."""
    return play_episode(Game(world, governance=governance), seed, episode, 0, trace=trace)


def play(world: World, *, seed: int, steps: int, episode_steps: int = 40,
         governance: bool = True, deadline_s: float | None = None) -> dict[str, Any]:
    """Plays ``steps`` actions in episodes of ``episode_steps``; returns the summary."""
    game = Game(world, governance=governance)
    t0 = time.monotonic()
    done = 0
    episode = 0
    violations: list[Violation] = []
    outcomes: dict[str, int] = {}
    payoffs: dict[str, int] = {}
    reverts = 0
    actions: dict[str, int] = {}
    minority = 0
    calls0 = world.rpc.calls
    while done < steps and (deadline_s is None or time.monotonic() - t0 < deadline_s):
        res = play_episode(game, seed, episode, min(episode_steps, steps - done))
        done += len(res.trace)
        reverts += res.reverts
        minority += res.minority_penalties
        for a in res.trace:
            actions[a["a"]] = actions.get(a["a"], 0) + 1
        violations += res.violations
        for k, v in res.outcomes.items():
            outcomes[k] = outcomes.get(k, 0) + v
        for k, v in res.payoffs.items():
            payoffs[k] = payoffs.get(k, 0) + v
        episode += 1
    wall = time.monotonic() - t0
    return {"steps": done, "episodes": episode, "actions": actions,
            "violations": len(violations), "seed": seed,
            "violation_list": [v.to_json() for v in violations],
            "reverted_actions": reverts, "outcomes": outcomes,
            "honest_minority_penalties": minority,
            "payoffs_wei": payoffs, "wall_s": round(wall, 2),
            "steps_per_s": round(done / wall, 2) if wall else 0.0,
            "rpc_calls_batched": world.rpc.calls - calls0}
