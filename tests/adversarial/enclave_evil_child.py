"""A compromised SoftwareEnclave child (spawned by reference, so it lives in an importable
module): what it writes to the parent is chosen by ``job_ref``. The parent holds the
verifier's account key; none of this may crash it, run code in it, or be taken as a result."""

from __future__ import annotations

import json
import pickle
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

BOMB = b"[" * 95_000 + b"]" * 95_000


class Touch:
    """Unpickling this creates ``path``: the proof that a parent ran the child's code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


def _result(**over: Any) -> bytes:
    msg = {"kind": "result", "result_type": "json", "result": {"vote": "0x" + "11" * 32},
           "shards_used": [1, 2, 3], "corrupt_shards": [], "refusals": {}, "key_ms": 1.0}
    return json.dumps({**msg, **over}).encode()


def evil_child(conn: Connection, spec: Any, requester: str, job_ref: str,
               job_args: dict[str, Any], epoch: int, purpose: str, challenge_id: str,
               *_per_receipt: Any) -> None:
    try:
        if job_ref == "bomb":
            conn.send_bytes(BOMB)
        elif job_ref == "pickle":
            conn.send_bytes(pickle.dumps(Touch(job_args["marker"])))
        elif job_ref == "oversize":
            conn.send_bytes(b'{"kind": "result", "pad": "' + b"x" * (33 << 20) + b'"}')
        elif job_ref == "no-kind":
            conn.send_bytes(b"[1, 2, 3]")
        elif job_ref == "constructor":  # names a type the parent would build
            conn.send_bytes(_result(result_type="builtins:eval", result="__import__('os')"))
        elif job_ref == "bad-shards":
            conn.send_bytes(_result(shards_used="all of them"))
        elif job_ref == "bad-envelope":
            conn.send_bytes(_result(result_type="envelope_contents", result="0xdeadbeef"))
        elif job_ref == "sign-flood":
            for _ in range(100):
                conn.send_bytes(json.dumps({"kind": "sign", "digest": "0x" + "ab" * 32}).encode())
                conn.recv_bytes(256)
        elif job_ref == "sign-bad-digest":
            conn.send_bytes(json.dumps({"kind": "sign", "digest": "0x" + "ab" * 40}).encode())
        elif job_ref == "sign-then-result":  # the well-behaved shape, for contrast
            conn.send_bytes(json.dumps({"kind": "sign", "digest": "0x" + "ab" * 32}).encode())
            sig = conn.recv_bytes(256)
            conn.send_bytes(_result(result={"signature": "0x" + sig.hex()}))
    finally:
        conn.close()
