"""Who may ask for a share: ``CommitteeOracle``.

Full challenges: the requester must be in the committee drawn for that challenge, and the
challenge must be open. Light audits: the requester must be a registered verifier.

Production shards use ``verinfer.kms.chain_oracle.ChainCommitteeOracle`` (direct reads of
ChallengeManager, StakeRegistry and ProtocolConfig). ``FileCommitteeOracle`` reads a JSON file
on every call and ``StaticCommitteeOracle`` holds it in memory: for tests and offline use only,
since whoever can write the file decides who gets shares.

File format: {"verifiers": ["0x…"], "challenges": {"<id>": {"status": "open"|"resolved",
"committee": ["0x…"], "receipt_hash": "0x…" (optional)}}, "audits": {"0x<verifier>":
["0x<receipt hash>", …]} (optional)}. Addresses compare case-insensitively. Receipt hashes
in the file are EIP-712 hashStructs (no domain: offline use has no deployment).

Per-receipt decryption (threshold epochs) asks two more questions: does an open challenge
dispute exactly this receipt (``challenge_covers``), and was a light audit of this receipt
*assigned* to the requester (``is_audit_assigned``) — by whoever draws audits, never chosen
by the auditor itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from verinfer.kms.errors import RegistryError
from verinfer.protocol.hexutil import parse_hex
from verinfer.receipts.eip712 import Receipt


class CommitteeOracle(Protocol):
    def is_committee_member(self, challenge_id: str, requester: str) -> bool:
        """True iff ``challenge_id`` is open and ``requester`` was drawn for its committee."""
        ...

    def is_registered_verifier(self, requester: str) -> bool: ...

    def challenge_covers(self, challenge_id: str, receipt: Receipt) -> bool:
        """True iff ``challenge_id`` is open and disputes exactly ``receipt``."""
        ...

    def is_audit_assigned(self, requester: str, receipt: Receipt) -> bool:
        """True iff a light audit of ``receipt`` was drawn for ``requester``."""
        ...


class StaticCommitteeOracle:
    def __init__(self, verifiers: Iterable[str] = (),
                 challenges: Mapping[str, tuple[str, Iterable[str]]] | None = None,
                 receipts: Mapping[str, bytes] | None = None,
                 audits: Mapping[str, Iterable[bytes]] | None = None) -> None:
        self.verifiers = {v.lower() for v in verifiers}
        self.challenges = {cid: (status, {m.lower() for m in members})
                           for cid, (status, members) in (challenges or {}).items()}
        self.receipts = dict(receipts or {})
        self.audits = {v.lower(): {bytes(d) for d in ds} for v, ds in (audits or {}).items()}

    def challenge_covers(self, challenge_id: str, receipt: Receipt) -> bool:
        entry = self.challenges.get(challenge_id)
        if entry is None or entry[0] != "open":
            return False
        return self.receipts.get(challenge_id) == receipt.struct_hash

    def is_audit_assigned(self, requester: str, receipt: Receipt) -> bool:
        return receipt.struct_hash in self.audits.get(requester.lower(), set())

    def is_committee_member(self, challenge_id: str, requester: str) -> bool:
        entry = self.challenges.get(challenge_id)
        return entry is not None and entry[0] == "open" and requester.lower() in entry[1]

    def is_registered_verifier(self, requester: str) -> bool:
        return requester.lower() in self.verifiers


class FileCommitteeOracle:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _load(self) -> StaticCommitteeOracle:
        try:
            raw: Any = json.loads(self.path.read_text())
            challenges = {str(cid): (str(c["status"]), [str(m) for m in c["committee"]])
                          for cid, c in raw.get("challenges", {}).items()}
            receipts = {str(cid): parse_hex(c["receipt_hash"], 32, f"challenges.{cid}.receipt_hash")
                        for cid, c in raw.get("challenges", {}).items()
                        if c.get("receipt_hash") is not None}
            audits = {str(v): [parse_hex(d, 32, f"audits.{v}") for d in ds]
                      for v, ds in raw.get("audits", {}).items()}
            return StaticCommitteeOracle([str(v) for v in raw.get("verifiers", [])], challenges,
                                         receipts, audits)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise RegistryError(f"cannot read committee file {self.path}: {e}") from e

    def is_committee_member(self, challenge_id: str, requester: str) -> bool:
        return self._load().is_committee_member(challenge_id, requester)

    def is_registered_verifier(self, requester: str) -> bool:
        return self._load().is_registered_verifier(requester)

    def challenge_covers(self, challenge_id: str, receipt: Receipt) -> bool:
        return self._load().challenge_covers(challenge_id, receipt)

    def is_audit_assigned(self, requester: str, receipt: Receipt) -> bool:
        return self._load().is_audit_assigned(requester, receipt)
