"""Logit digests: a commitment to every bit of each step's float32 logits.

step digest = BLAKE2b-256(DOMAIN || n_leaves (u32 BE) || leaf_0 || leaf_1 || ...), where
leaf_i = BLAKE2b-256 of the i-th LEAF_FLOATS-sized chunk of the raw little-endian float32
logits (the last chunk may be shorter). The leaf split is fixed, so the digest does not depend
on how many threads hashed it; leaves are hashed in parallel because hashlib releases the GIL
and a 262k-entry vocabulary makes 1 MiB of logits per step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

DOMAIN = b"verinfer/logits-step/v1"
ROLLUP_DOMAIN = b"verinfer/logits/v1"
LEAF_FLOATS = 1 << 16  # 256 KiB leaves
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="verinfer-digest")


def _leaf(buf: memoryview) -> bytes:
    return hashlib.blake2b(buf, digest_size=32).digest()


def step_digests(logits: torch.Tensor) -> list[bytes]:
    """Digest of each row of ``logits`` [R, V] (float32)."""
    if logits.dtype != torch.float32 or logits.dim() != 2:
        raise ValueError("logits must be a float32 [R, V] tensor")
    arr = logits.contiguous().numpy()
    rows, vocab = arr.shape
    n_leaves = (vocab + LEAF_FLOATS - 1) // LEAF_FLOATS
    views = [memoryview(arr[r, i * LEAF_FLOATS:(i + 1) * LEAF_FLOATS].data).cast("B")
             for r in range(rows) for i in range(n_leaves)]
    leaves = list(_POOL.map(_leaf, views)) if len(views) > 1 else [_leaf(v) for v in views]
    head = DOMAIN + n_leaves.to_bytes(4, "big")
    return [hashlib.blake2b(head + b"".join(leaves[r * n_leaves:(r + 1) * n_leaves]),
                            digest_size=32).digest() for r in range(rows)]


def roll_up(steps: Sequence[bytes]) -> str:
    """One digest over all steps of a generation, ``0x``-hex."""
    return "0x" + hashlib.blake2b(ROLLUP_DOMAIN + b"".join(steps), digest_size=32).hexdigest()
