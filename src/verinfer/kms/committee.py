"""Who may ask for a share: ``CommitteeOracle``.

Full challenges: the requester must be in the committee drawn for that challenge, and the
challenge must be open. Light audits: the requester must be a registered verifier.

Production shards use ``verinfer.kms.chain_oracle.ChainCommitteeOracle`` (direct reads of
ChallengeManager, StakeRegistry and ProtocolConfig). ``FileCommitteeOracle`` reads a JSON file
on every call and ``StaticCommitteeOracle`` holds it in memory: for tests and offline use only,
since whoever can write the file decides who gets shares.

File format: {"verifiers": ["0x…"], "challenges": {"<id>": {"status": "open"|"resolved",
"committee": ["0x…"]}}}. Addresses compare case-insensitively.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from verinfer.kms.errors import RegistryError


class CommitteeOracle(Protocol):
    def is_committee_member(self, challenge_id: str, requester: str) -> bool:
        """True iff ``challenge_id`` is open and ``requester`` was drawn for its committee."""
        ...

    def is_registered_verifier(self, requester: str) -> bool: ...


class StaticCommitteeOracle:
    def __init__(self, verifiers: Iterable[str] = (),
                 challenges: Mapping[str, tuple[str, Iterable[str]]] | None = None) -> None:
        self.verifiers = {v.lower() for v in verifiers}
        self.challenges = {cid: (status, {m.lower() for m in members})
                           for cid, (status, members) in (challenges or {}).items()}

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
            return StaticCommitteeOracle([str(v) for v in raw.get("verifiers", [])], challenges)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise RegistryError(f"cannot read committee file {self.path}: {e}") from e

    def is_committee_member(self, challenge_id: str, requester: str) -> bool:
        return self._load().is_committee_member(challenge_id, requester)

    def is_registered_verifier(self, requester: str) -> bool:
        return self._load().is_registered_verifier(requester)
