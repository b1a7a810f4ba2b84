"""Decode policy: greedy or seeded sampling with a counter-based PRNG.

The random number for the token at absolute position ``p`` is a pure function of
``(seed, p)`` — there is no RNG stream to share, so a token's draw never depends on which other
requests ran, on the order of steps, or on whether it is being replayed.

Sampling rule ``vi-sample-v2`` (fixed; csrc/verinfer_sampling.cpp runs it, ``sample_reference``
below is its executable numpy definition and the tests hold the two to the same token):
- ``temperature == 0``: argmax, first index on ties.
- scaled logits ``z = logit / temperature`` in float64.
- top-k keeps the k largest ``z`` (ties: lower token id first).
- ``p = exp64(z - max z)``: an exp made of IEEE double ``+ - *`` only (no libm, no FMA), so the
  draw cannot depend on the machine's math library or numpy's SIMD dispatch.
- top-p keeps the shortest prefix of the survivors, ordered by probability (ties: lower id),
  whose running mass (summed in that order) reaches ``top_p`` times the survivors' total mass
  (summed sequentially in token-id order); at least one token is kept.
- draw: walk the kept tokens in token-id order, return the first whose running mass exceeds
  ``u * kept_mass``, with ``u`` = uniform(seed, p) in [0, 1).
Every sum is sequential in the order named: float addition is not associative, and the chosen
token must not depend on how a library splits a sum.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

# The parameters type is the protocol's (ExecRequest.sampling_params builds it): import it from
# verinfer.protocol.sampling_params, its one home.
from verinfer.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:  # torch loads only where tokens are drawn
    import torch

__all__ = ["PRNG_DOMAIN", "SAMPLING_RULE", "exp64_reference", "sample", "sample_reference",
           "sample_rows", "uniform"]

PRNG_DOMAIN = b"verinfer/sampling/v1"


def uniform(seed: int, position: int) -> float:
    """Counter-based PRNG: a uniform double in [0, 1) from (seed, absolute position)."""
    msg = PRNG_DOMAIN + seed.to_bytes(8, "big") + position.to_bytes(8, "big")
    word = int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "big")
    return (word >> 11) * (1.0 / (1 << 53))


# The seed rules (a request's seed when it gives none, one seed per choice) are protocol rules:
# verinfer.protocol.request_rule.request_seed / choice_seed. The engine only draws with a seed.


SAMPLING_RULE = "vi-sample-v2"  # recorded in the engine fingerprint

# exp64 constants (bit-identical to csrc/verinfer_sampling.cpp)
_SHIFTER = float.fromhex("0x1.8p52")  # adding it rounds a double to an integer (to nearest)
_LOG2E = float.fromhex("0x1.71547652b82fep+0")
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # n * _LN2_HI is exact for |n| < 2^21
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
_EXP_FLOOR = -700.0
_INV_FACT = tuple(1.0 / math.factorial(k) for k in range(13, -1, -1))  # 1/13! .. 1/0!


def exp64_reference(x: np.ndarray) -> np.ndarray:
    """exp of float64 ``x`` <= 0 by the sampler's rule, in numpy (each numpy float64 ``+ - *``
    is one IEEE operation, so this gives the C kernel's bits): 0 below -700; else
    n = round(x / ln2), Cody-Waite reduction, degree-13 Taylor polynomial, times 2^n."""
    xc = np.maximum(x, _EXP_FLOOR)
    t = xc * _LOG2E + _SHIFTER
    n = t - _SHIFTER
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = np.full_like(r, _INV_FACT[0])
    for c in _INV_FACT[1:]:
        p = p * r + c
    scale = ((t.view(np.int64) + 1023) << 52).view(np.float64)
    return np.where(x < _EXP_FLOOR, 0.0, p * scale)


def sample_reference(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    """The sampling rule written out in numpy (slow, obviously in order): the definition that
    :func:`sample` (the C kernel) must match token for token."""
    if params.greedy:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / params.temperature
    if not np.isfinite(z).all():
        raise ValueError("logits contain a NaN or an infinity")
    ids = np.arange(z.shape[0])
    if 0 < params.top_k < z.shape[0]:
        ranked = np.lexsort((ids, -z))  # z descending, then id ascending
        ids = np.sort(ranked[: params.top_k])
    p = exp64_reference(z[ids] - z[ids].max())
    if params.top_p < 1.0:
        target = params.top_p * float(np.cumsum(p)[-1])  # np.cumsum adds sequentially
        order = np.lexsort((np.arange(p.shape[0]), -p))  # p descending, then id ascending
        run = np.cumsum(p[order])
        n_keep = min(int(np.searchsorted(run, target, side="left")) + 1, p.shape[0])
        keep = np.sort(order[:n_keep])
        ids, p = ids[keep], p[keep]
    csum = np.cumsum(p)
    u = uniform(params.seed, position)
    j = min(int(np.searchsorted(csum, u * csum[-1], side="right")), csum.shape[0] - 1)
    return int(ids[j])


def sample(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    """Choose the token at ``position`` from one row of float32 logits."""
    if params.greedy:
        return int(np.argmax(logits))
    import torch

    row = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))
    return sample_rows(row[None, :], params, [position])[0]


def sample_rows(logits: torch.Tensor, params: SamplingParams,
                positions: Sequence[int] | range) -> list[int]:
    """The token for each row of ``logits`` [R, V] (float32), row r at ``positions[r]``; rows
    run in parallel in the kernel (every draw depends only on its own row)."""
    if len(positions) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows but {len(positions)} positions")
    if params.greedy:
        return [int(i) for i in np.argmax(logits.numpy(), axis=1)]
    import torch

    from verinfer.engine import kernels

    us = torch.tensor([uniform(params.seed, pos) for pos in positions], dtype=torch.float64)
    return [int(i) for i in kernels.sample_rows(logits, params.temperature, params.top_k,
                                                params.top_p, us)]

