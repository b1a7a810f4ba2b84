"""Shamir secret sharing over Z_q with Feldman commitments on secp256k1.

q is the secp256k1 group order. The dealer picks f(x) = a_0 + a_1 x + ... + a_{t-1} x^{t-1}
with a_0 = s; share i is (i, f(i)) for i = 1..n; the commitments are C_j = a_j·G. Anyone
holding the commitments checks a share with  f(i)·G == sum_j i^j·C_j  (no secret needed).

Point arithmetic uses coincurve (libsecp256k1): one full scalar multiplication per check plus
t tiny ones. Secrets are Python ints here; see docs/kms.md for what that means for zeroization.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from coincurve import PublicKey

from verinfer.kms.errors import (
    InvalidShareError,
    NotEnoughSharesError,
    ShareVerificationError,
)

# secp256k1 group order
Q = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
MAX_SHARES = 255

RandBelow = Callable[[int], int]
"""rng(k) -> uniform int in [0, k). Production passes ``secrets.randbelow``."""


@dataclass(frozen=True)
class Share:
    index: int  # x coordinate, 1..n (= the shard index)
    value: int  # f(index) mod q

    def __post_init__(self) -> None:
        if not 1 <= self.index <= MAX_SHARES:
            raise InvalidShareError(f"share index {self.index} not in 1..{MAX_SHARES}")
        if not 0 <= self.value < Q:
            raise InvalidShareError(f"share {self.index}: value out of range [0, q)")

    def __repr__(self) -> str:  # never print share material
        return f"Share(index={self.index}, value=<redacted>)"


def check_params(threshold: int, shares: int) -> None:
    if not 1 <= threshold <= shares <= MAX_SHARES:
        raise InvalidShareError(
            f"need 1 <= threshold <= shares <= {MAX_SHARES}, got threshold={threshold} "
            f"shares={shares}")


def random_scalar(rng: RandBelow) -> int:
    """Uniform in [1, q)."""
    return 1 + rng(Q - 1)


def split(secret: int, threshold: int, shares: int, rng: RandBelow
          ) -> tuple[list[Share], list[bytes]]:
    """Split ``secret`` t-of-n. Returns (shares, Feldman commitments as 33-byte points)."""
    check_params(threshold, shares)
    if not 1 <= secret < Q:
        raise InvalidShareError("secret must be in [1, q)")
    coeffs = [secret] + [random_scalar(rng) for _ in range(threshold - 1)]
    commitments = [scalar_base_mult(a) for a in coeffs]
    out = [Share(i, _eval_poly(coeffs, i)) for i in range(1, shares + 1)]
    for k in range(len(coeffs)):  # drop our references early (ints are immutable; best effort)
        coeffs[k] = 0
    return out, commitments


def _eval_poly(coeffs: Sequence[int], x: int) -> int:
    acc = 0
    for a in reversed(coeffs):
        acc = (acc * x + a) % Q
    return acc


def scalar_base_mult(k: int) -> bytes:
    """k·G, compressed SEC1 (33 bytes)."""
    if not 1 <= k < Q:
        raise InvalidShareError("scalar must be in [1, q)")
    return PublicKey.from_secret(k.to_bytes(32, "big")).format(compressed=True)


def parse_commitments(commitments: Sequence[bytes], threshold: int) -> list[PublicKey]:
    if len(commitments) != threshold:
        raise InvalidShareError(
            f"expected {threshold} commitments, got {len(commitments)}")
    out = []
    for j, c in enumerate(commitments):
        try:
            out.append(PublicKey(bytes(c)))
        except (ValueError, TypeError) as e:
            raise InvalidShareError(f"commitment {j} is not a secp256k1 point: {c.hex()}") from e
    return out


def expected_share_point(commitments: Sequence[bytes], index: int) -> bytes:
    """sum_j index^j · C_j (compressed) — what share ``index`` times G must equal."""
    points = parse_commitments(commitments, len(commitments))
    terms = [points[0]]
    for j in range(1, len(points)):
        e = pow(index, j, Q)
        terms.append(points[j].multiply(e.to_bytes(32, "big")))
    try:
        total = PublicKey.combine_keys(terms) if len(terms) > 1 else terms[0]
    except ValueError as e:  # sum is the point at infinity: no valid share can match
        raise InvalidShareError(f"commitments sum to infinity at index {index}") from e
    return total.format(compressed=True)


def verify_share(share: Share, commitments: Sequence[bytes]) -> None:
    """Raise ShareVerificationError naming the shard if the share is not on the committed
    polynomial."""
    expected = expected_share_point(commitments, share.index)
    if share.value == 0 or scalar_base_mult(share.value) != expected:
        raise ShareVerificationError(
            f"share from shard {share.index} does not match the epoch commitments",
            shard_index=share.index)


def reconstruct(shares: Sequence[Share], threshold: int) -> int:
    """Lagrange interpolation at x = 0 from exactly ``threshold`` distinct shares.

    With fewer than t shares every secret is equally consistent, so we refuse rather than
    return a value that looks like a key.
    """
    distinct: Mapping[int, Share] = {s.index: s for s in shares}
    if len(distinct) != len(shares):
        raise InvalidShareError(f"duplicate share indices: {[s.index for s in shares]}")
    if len(distinct) < threshold:
        raise NotEnoughSharesError(
            f"need {threshold} shares, have {len(distinct)} ({sorted(distinct)})")
    use = [distinct[i] for i in sorted(distinct)[:threshold]]
    secret = 0
    for s in use:
        num, den = 1, 1
        for o in use:
            if o.index != s.index:
                num = num * (-o.index) % Q
                den = den * (s.index - o.index) % Q
        secret = (secret + s.value * num * pow(den, -1, Q)) % Q
    return secret


def public_key_of(secret: int) -> bytes:
    """s·G compressed; equals commitments[0] when the secret is right."""
    return scalar_base_mult(secret)
