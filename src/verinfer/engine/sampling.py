"""Decode policy: greedy or seeded sampling with a counter-based PRNG.

The random number for the token at absolute position ``p`` is a pure function of
``(seed, p)`` — there is no RNG stream to share, so a token's draw never depends on which other
requests ran, on the order of steps, or on whether it is being replayed.

Pipeline (fixed): temperature → top-k → top-p → draw.
- ``temperature == 0``: argmax, first index on ties.
- scaled logits ``z = logit / temperature`` in float64.
- top-k keeps the k largest ``z`` (ties: lower token id first).
- top-p keeps the shortest prefix of the survivors, ordered by probability (ties: lower id),
  whose running mass (summed in that order) reaches ``top_p`` times the survivors' total mass
  (``numpy.sum`` in token-id order); at least one token is kept.
- draw: walk the kept tokens in token-id order, return the first whose running mass exceeds
  ``u * kept_mass``, with ``u`` = uniform(seed, p) in [0, 1).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from verinfer.errors import InvalidRequestError

PRNG_DOMAIN = b"verinfer/sampling/v1"
MAX_SEED = 2**64 - 1
MAX_U32 = 2**32 - 1  # the receipts' canonical encoding holds top_k and max_tokens as u32


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int = 0
    ignore_eos: bool = False

    def validate(self) -> SamplingParams:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidRequestError(
                f"max_tokens must be a positive integer, got {self.max_tokens!r}",
                param="max_tokens")
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError(
                f"temperature must be in [0, 2], got {self.temperature!r}", param="temperature")
        if not 0 <= self.top_k <= MAX_U32:
            raise InvalidRequestError(f"top_k must be in [0, 2^32), got {self.top_k!r}",
                                      param="top_k")
        if self.max_tokens > MAX_U32:
            raise InvalidRequestError(f"max_tokens must be < 2^32, got {self.max_tokens!r}",
                                      param="max_tokens")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}",
                                      param="top_p")
        if not 0 <= self.seed <= MAX_SEED:
            raise InvalidRequestError(f"seed must be in [0, 2^64), got {self.seed!r}",
                                      param="seed")
        if len(self.stop) > 4 or any(not s for s in self.stop):
            raise InvalidRequestError("stop takes up to 4 non-empty strings", param="stop")
        for s in self.stop:
            try:
                s.encode()
            except UnicodeEncodeError:  # a lone surrogate from JSON "\ud800": not text
                raise InvalidRequestError(f"stop string {s!r} is not valid Unicode",
                                          param="stop") from None
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def uniform(seed: int, position: int) -> float:
    """Counter-based PRNG: a uniform double in [0, 1) from (seed, absolute position)."""
    msg = PRNG_DOMAIN + seed.to_bytes(8, "big") + position.to_bytes(8, "big")
    word = int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "big")
    return (word >> 11) * (1.0 / (1 << 53))


def derive_seed(req_hash: bytes) -> int:
    """Seed for a request that gave none: the first 8 bytes of its request hash."""
    return int.from_bytes(hashlib.sha256(b"verinfer/seed/v1" + req_hash).digest()[:8], "big")


def request_seed(model_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> int:
    """The seed of a request that gave none (a protocol rule operators and verifiers share):
    derived from what decides the output — model id (0x-hex), prompt token ids and the decode
    policy — never from transport details such as ``stream``, so the same request streams the
    same text."""
    doc = json.dumps([model_id, list(prompt_ids), params.max_tokens, float(params.temperature),
                      params.top_k, float(params.top_p), list(params.stop), params.ignore_eos],
                     separators=(",", ":"))
    return derive_seed(hashlib.sha256(doc.encode()).digest())


def choice_seed(seed: int, index: int) -> int:
    """Choice 0 of a request uses its seed; choice i > 0 a seed derived from (seed, i)."""
    if index == 0:
        return seed
    return derive_seed(hashlib.sha256(b"verinfer/choice/v1" + seed.to_bytes(8, "big")
                                      + index.to_bytes(4, "big")).digest())


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """Positions (ascending) of the top-p nucleus of unnormalized probabilities ``p``.

    Sorts only as many candidates as needed: the nucleus is a prefix of the total order
    (probability descending, position ascending), so sorting a larger candidate set that
    contains it gives the same prefix.
    """
    target = top_p * float(np.sum(p))
    m = 256
    while True:
        if m >= p.shape[0]:
            cand = np.arange(p.shape[0])
        else:
            kth = np.partition(p, p.shape[0] - m)[p.shape[0] - m]
            cand = np.flatnonzero(p >= kth)  # ascending positions; ties at kth all included
        order = cand[np.argsort(-p[cand], kind="stable")]
        csum = np.cumsum(p[order])
        n_keep = int(np.searchsorted(csum, target, side="left")) + 1
        if n_keep <= order.shape[0] and (n_keep < order.shape[0] or cand.shape[0] == p.shape[0]):
            return np.sort(order[:n_keep])
        if cand.shape[0] == p.shape[0]:
            return np.sort(order)
        m *= 8


def _top_k_ids(z: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest entries (ties: lower id), in ascending id order."""
    if k >= z.shape[0]:
        return np.arange(z.shape[0])
    kth = np.partition(z, z.shape[0] - k)[z.shape[0] - k]  # the k-th largest value
    above = np.flatnonzero(z > kth)
    ties = np.flatnonzero(z == kth)[: k - above.shape[0]]
    return np.sort(np.concatenate([above, ties]))


def sample(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    """Choose the token at ``position`` from one row of float32 logits."""
    if params.greedy:
        return int(np.argmax(logits))
    # In-place steps on one float64 buffer: the same IEEE operations as the spelled-out
    # pipeline, without a fresh 2 MB temporary per step (replay samples every position).
    z = logits.astype(np.float64)
    z /= params.temperature
    ids: np.ndarray | None = None
    if params.top_k:
        ids = _top_k_ids(z, params.top_k)
        z = z[ids]
    z -= z.max()
    p = np.exp(z, out=z)
    if params.top_p < 1.0:
        keep = _nucleus(p, params.top_p)
        ids = keep if ids is None else ids[keep]
        p = p[keep]
    csum = np.cumsum(p, out=p)
    u = uniform(params.seed, position)
    j = min(int(np.searchsorted(csum, u * csum[-1], side="right")), csum.shape[0] - 1)
    return int(j if ids is None else ids[j])
