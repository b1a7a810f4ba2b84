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

Sampling rule ``vi-sample-v3`` (an ExecRequest names it with ``"sampler": "vi-sample-v3"`` when
it uses any of the below; a request without them is a ``vi-sample-v2`` request and v3 with
neutral options *is* v2, token for token: ``sample_v3`` runs v2's own steps after the ones
below, and the tests hold the two to the same token). Before the temperature, per token id ``i``
in float64, each step one IEEE operation (no FMA, each element on its own, so no order to fix):
- ``l_i = float64(logit_i)``;
- ``l_i = l_i + b_i`` for every id the request's ``logit_bias`` names (``b_i`` its double);
- with ``c_i`` = how many times ``i`` occurs in the output *before* this position (the prompt
  does not count, as in vLLM): ``l_i = l_i - float64(c_i) * frequency_penalty`` (the product
  rounded, then the difference), then ``l_i = l_i - presence_penalty`` where ``c_i > 0``;
- the grammar mask (structured outputs, verinfer.protocol.grammar): only ids the grammar allows
  after the output so far stay candidates (llguidance's matcher, fed the output tokens in
  order); when it allows none (the matcher is in error), the token is the tokenizer's first
  EOS/EOT id.
Then on the candidates only: greedy is the first argmax of ``l``; else ``z = l / temperature``
and v2's top-k, top-p and draw, with "token-id order" the candidates' ascending ids.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

# The parameters type is the protocol's (ExecRequest.sampling_params builds it): import it from
# verinfer.protocol.sampling_params, its one home.
from verinfer.protocol.sampling_params import (
    EXTENDED_SAMPLER,
    SamplingParams,
)

if TYPE_CHECKING:  # torch loads only where tokens are drawn
    import torch

__all__ = ["PRNG_DOMAIN", "SAMPLING_RULE", "SAMPLING_RULE_V3", "adjusted_logits",
           "exp64_reference", "sample", "sample_reference", "sample_rows", "sample_v3", "uniform"]

PRNG_DOMAIN = b"verinfer/sampling/v1"


def uniform(seed: int, position: int) -> float:
    """Counter-based PRNG: a uniform double in [0, 1) from (seed, absolute position)."""
    msg = PRNG_DOMAIN + seed.to_bytes(8, "big") + position.to_bytes(8, "big")
    word = int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "big")
    return (word >> 11) * (1.0 / (1 << 53))


# The seed rules (a request's seed when it gives none, one seed per choice) are protocol rules:
# verinfer.protocol.request_rule.request_seed / choice_seed. The engine only draws with a seed.


SAMPLING_RULE = "vi-sample-v2"  # recorded in the engine fingerprint
SAMPLING_RULE_V3 = EXTENDED_SAMPLER  # named by the ExecRequest that uses it

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
    return _draw(z, np.arange(z.shape[0]), params, position)


def _draw(z: np.ndarray, ids: np.ndarray, params: SamplingParams, position: int) -> int:
    """v2's steps after the temperature: top-k, top-p and the draw over candidates ``ids``
    (ascending) whose scaled logits are ``z``."""
    if not np.isfinite(z).all():
        raise ValueError("logits contain a NaN or an infinity")
    if 0 < params.top_k < z.shape[0]:
        ranked = np.lexsort((ids, -z))  # z descending, then id ascending
        keep_k = np.sort(ranked[: params.top_k])
        ids, z = ids[keep_k], z[keep_k]
    p = exp64_reference(z - z.max())
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



# ---- vi-sample-v3 -------------------------------------------------------------------------------
def adjusted_logits(logits: np.ndarray, params: SamplingParams,
                    counts: dict[int, int] | None = None) -> np.ndarray:
    """v3's float64 logits before the temperature: bias, then frequency and presence
    penalties (module docstring). ``counts``: token id -> occurrences in the output so far."""
    lg = logits.astype(np.float64)  # a copy: the caller's row is never changed
    if params.logit_bias:
        ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)
        lg[ids] = lg[ids] + np.array([b for _, b in params.logit_bias], dtype=np.float64)
    if counts and (params.frequency_penalty or params.presence_penalty):
        ids = np.array(sorted(counts), dtype=np.int64)
        c = np.array([counts[int(i)] for i in ids], dtype=np.float64)
        lg[ids] = lg[ids] - c * params.frequency_penalty
        lg[ids] = lg[ids] - params.presence_penalty
    return lg


def sample_v3(logits: np.ndarray, params: SamplingParams, position: int, *,
              counts: dict[int, int] | None = None, allowed: np.ndarray | None = None,
              fallback: int = 0) -> int:
    """Rule vi-sample-v3 for one row of float32 logits: ``counts`` of the output so far,
    ``allowed`` the grammar's mask (bool [V]; None: every id), ``fallback`` the id chosen when
    the mask allows none (the first EOS/EOT id)."""
    lg = adjusted_logits(logits, params, counts)
    ids = np.arange(lg.shape[0]) if allowed is None else np.flatnonzero(allowed[:lg.shape[0]])
    if ids.shape[0] == 0:
        return fallback
    cand = lg[ids]
    if params.greedy:
        return int(ids[int(np.argmax(cand))])
    return _draw(cand / params.temperature, ids, params, position)
