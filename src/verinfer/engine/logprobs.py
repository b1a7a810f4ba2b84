"""Log-probabilities by a fixed rule (``vi-logprob-v1``), so that they can be committed.

Logprobs are part of the ExecResult (docs/receipts.md §1): the operator signs them and every
verifier recomputes them and compares bytes. That needs a rule whose every bit is fixed, like
the sampling rule — ``np.exp``/``np.log`` and numpy's pairwise ``sum`` depend on the SIMD path
numpy dispatches to (AVX-512 vs AVX2 give different last bits), so an honest operator and an
honest verifier on different CPUs would disagree and one of them would be slashed.

Rule ``vi-logprob-v1``, for one row of float32 logits ``x`` (temperature 1, before top-k/top-p:
the model's own distribution, as OpenAI reports it):
- ``z = float64(x)`` (exact), ``m = max z``;
- ``s = sum of exp64(z[i] - m)``, added sequentially in token-id order (``exp64``: the
  sampler's IEEE-only exp, sampling.py / csrc/verinfer_sampling.cpp);
- ``L = log64(s)`` (below: IEEE ``+ - * /`` only);
- ``logprob(i) = (z[i] - m) - L``;
- the top ``k``: the ``k`` largest ``z``, ties to the lower token id, best first.
Every step is one IEEE double operation in a fixed order, so the values are a pure function of
the logits' bits, which the engine already makes batch invariant and replayable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LOGPROB_RULE = "vi-logprob-v1"

_SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")  # same split as exp64: e * _LN2_HI is exact
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
# 2 atanh(t) = 2 (t + t^3/3 + t^5/5 + ...); |t| <= 0.1716 after the reduction below, so 15
# odd terms leave a truncation error far below one ulp (0.1716^32 / 33 < 1e-26)
_ATANH = tuple(1.0 / (2 * k + 1) for k in range(15, -1, -1))  # 1/31 .. 1/1


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's logprob and the ``k`` most likely alternatives (id, logprob), best
    first — exactly the values an ExecResult commits and the API returns."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def log64(x: float) -> float:
    """Natural log of a finite ``x`` >= 1 by a fixed sequence of IEEE double operations
    (``math.frexp`` is exact; no libm), within ~1 ulp of the true value."""
    if not (x >= 1.0 and math.isfinite(x)):
        raise ValueError(f"log64 takes a finite x >= 1, got {x!r}")
    mant, e = math.frexp(x)  # x = mant * 2^e, mant in [0.5, 1)
    if mant < _SQRT_HALF:
        mant, e = mant * 2.0, e - 1  # now mant in [sqrt(1/2), sqrt(2)): |t| small
    f = mant - 1.0
    t = f / (2.0 + f)
    t2 = t * t
    p = _ATANH[0]
    for c in _ATANH[1:]:
        p = p * t2 + c
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * t * p)


def _exp64(x: np.ndarray) -> np.ndarray:
    """exp64 over a float64 array: the C kernel when built (fast), else the numpy reference
    (the same IEEE operations, held to the same bits by tests)."""
    from verinfer.engine import kernels

    if kernels.available():
        import torch

        return kernels.exp64(torch.from_numpy(np.ascontiguousarray(x))).numpy()
    from verinfer.engine.sampling import exp64_reference

    return exp64_reference(x)


def _top(z: np.ndarray, k: int) -> list[int]:
    """The ``k`` token ids with the largest z, ties to the lower id, best first. Defined by
    value, not by a selection algorithm: ``np.partition`` only supplies the k-th value (which
    any algorithm agrees on); which tied ids are taken is then fixed by id order."""
    if k <= 0:
        return []
    v = z.shape[0]
    kth = float(np.partition(z, v - k)[v - k]) if k < v else float(z.min())
    cand = np.flatnonzero(z >= kth)
    order = np.lexsort((cand, -z[cand]))[:k]  # z descending, then id ascending
    return [int(i) for i in cand[order]]


def row_logprobs(logits: np.ndarray, token_ids: Sequence[int], top: int
                 ) -> list[TokenLogprob]:
    """Rule vi-logprob-v1 for every row of float32 ``logits`` [R, V] (or one row [V]) and the
    token chosen there. Rows are independent: a row's values never depend on the others."""
    x = np.asarray(logits)
    if x.dtype != np.float32:
        raise ValueError(f"logits must be float32, got {x.dtype}")
    if x.ndim == 1:
        x = x[None, :]
    if x.shape[0] != len(token_ids):
        raise ValueError(f"{x.shape[0]} rows but {len(token_ids)} tokens")
    out = []
    for r, tok in enumerate(token_ids):
        z = x[r].astype(np.float64)
        if not np.isfinite(z).all():
            raise ValueError("logits contain a NaN or an infinity")
        m = float(z.max())
        d = z - m  # exact per element; <= 0
        s = float(np.cumsum(_exp64(d))[-1])  # np.cumsum adds strictly in index order
        lse = log64(s)  # s >= 1: the maximum contributes exp64(0) = 1
        best = tuple((i, float(d[i]) - lse) for i in _top(z, top))
        out.append(TokenLogprob(int(tok), float(d[int(tok)]) - lse, best))
    return out


def token_logprob(logits: np.ndarray, token_id: int, top: int) -> TokenLogprob:
    """One row's :func:`row_logprobs`."""
    return row_logprobs(logits, [token_id], top)[0]


def reference_logprob(logits: np.ndarray, token_id: int, top: int) -> TokenLogprob:
    """The rule written out with plain Python floats (slow, obviously sequential): the
    definition :func:`row_logprobs` must match bit for bit (tests)."""
    from verinfer.engine.sampling import exp64_reference

    z = [float(v) for v in np.asarray(logits, dtype=np.float32).tolist()]
    m = max(z)
    s = 0.0
    for v in exp64_reference(np.array([zi - m for zi in z])).tolist():
        s = s + v
    lse = log64(s)
    ranked = sorted(range(len(z)), key=lambda i: (-z[i], i))[:top] if top > 0 else []
    return TokenLogprob(token_id, (z[token_id] - m) - lse,
                        tuple((i, (z[i] - m) - lse) for i in ranked))
