"""The encapsulated keys a shard has decrypted for, durably: (epoch, E) -> ciphertext hash.

A P256 envelope's proof of knowledge of e = log_G(E) (``receipts/encapsulation.py``) stops
anyone but E's sealer from putting E into another blob. The sealer itself knows e and can prove
it again for a second envelope under another receipt; s·E released for the second would open
the first too, while the release log names only the second. So a shard answers for an E only
when it has never answered for that E with another ciphertext: the first envelope decrypted
claims E, and a later request whose blob carries the same E with a different ciphertext hash is
``encapsulation_reused``. The same blob again (another committee member, an audit, a receipt
that differs only in issuedAt — which opens the same bytes under the same binding) is not a
reuse.

Only requests that passed the whole release policy (quote, signature, committee or audit
assignment) and whose proof verified reach :meth:`claim`, so nobody can claim a victim's E
in advance. File: JSON Lines ``{"epoch", "enc", "ciphertext_hash"}`` appended and fsync'd
before the shard answers; a torn last line (a crash mid-write, nothing answered for it) is
dropped at load.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from verinfer.kms.errors import EncapsulationReusedError, EncapsulationStoreError
from verinfer.protocol.hexutil import HexFormatError, parse_hex, to_hex

FILE_NAME = "released-encapsulations.jsonl"


class ReleasedEncapsulations:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._claims: dict[tuple[int, bytes], bytes] = {}
        self._load()

    def __len__(self) -> int:
        return len(self._claims)

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        complete = data[:data.rfind(b"\n") + 1]
        if len(complete) != len(data):  # torn last line: never acknowledged
            with open(self.path, "r+b") as f:
                f.truncate(len(complete))
                f.flush()
                os.fsync(f.fileno())
        for n, line in enumerate(complete.splitlines(), 1):
            try:
                d = json.loads(line)
                key = (int(d["epoch"]), parse_hex(d["enc"], 65, "enc"))
                ct_hash = parse_hex(d["ciphertext_hash"], 32, "ciphertext_hash")
            except (ValueError, KeyError, TypeError, HexFormatError) as e:
                raise EncapsulationStoreError(f"{self.path}:{n}: not a claim ({e})") from None
            self._claims.setdefault(key, ct_hash)

    def claim(self, epoch: int, enc: bytes, ciphertext_hash: bytes) -> None:
        """Record that this shard answers for E = ``enc`` of ``epoch`` with the envelope whose
        hash is ``ciphertext_hash``; raise :class:`EncapsulationReusedError` if it answered for
        E with another envelope. Durable before it returns."""
        key = (epoch, bytes(enc))
        with self._lock:
            prior = self._claims.get(key)
            if prior == ciphertext_hash:
                return
            if prior is not None:
                raise EncapsulationReusedError(
                    f"encapsulated key 0x{enc[:9].hex()}… of epoch {epoch} was already "
                    f"decrypted for ciphertext {to_hex(prior)}, not {to_hex(ciphertext_hash)}")
            line = json.dumps({"epoch": epoch, "enc": to_hex(enc),
                               "ciphertext_hash": to_hex(ciphertext_hash)}) + "\n"
            with open(self.path, "ab") as f:
                f.write(line.encode())
                f.flush()
                os.fsync(f.fileno())
            self._claims[key] = bytes(ciphertext_hash)
