"""Threshold decapsulation of HPKE DHKEM(P-256, HKDF-SHA256): per-envelope keys, never the
epoch key.

The epoch secret s is Shamir-shared over the P-256 group order N with Feldman commitments
C_j = a_j·G (C_0 = s·G is the epoch's HPKE public key). For one envelope with encapsulated key
E, shard i returns D_i = s_i·E and a Chaum–Pedersen proof that log_G(V_i) = log_E(D_i), where
V_i = Σ_j i^j·C_j is shard i's public verification key (computable by anyone from the
commitments). The requester checks every proof, combines t of them by Lagrange interpolation
*in the exponent* to s·E, and finishes RFC 9180's DHKEM Decap and base-mode key schedule for
that envelope only. s·E opens one envelope (E is fresh per envelope) and says nothing about s
(computational Diffie-Hellman), so nobody, enclave included, ever holds the epoch key.

Group arithmetic: pycryptodome's ``Crypto.PublicKey.ECC`` (points in C, on-curve checked on
import). HPKE labelled extract/expand: HMAC and HKDF-Expand from ``cryptography``; AEAD from
``cryptography``. Nothing here is hand-written curve or cipher code.

Secret generation lives in :func:`deal` only (called by keygen). There is deliberately no
function that interpolates scalars: the only interpolation is of points (:func:`combine`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from Crypto.PublicKey import ECC
from cryptography.hazmat.primitives.asymmetric import ec

from verinfer.kms.errors import (
    InvalidShareError,
    NotEnoughSharesError,
    ShareVerificationError,
)
from verinfer.receipts import encapsulation

#: P-256 group order (FIPS 186-4 D.1.2.3).
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
CURVE = "P-256"
MAX_SHARES = 255
KEM_ID = encapsulation.KEM_ID
KDF_ID = encapsulation.KDF_ID
AEAD_AES128GCM = encapsulation.AEAD_AES128GCM
AEAD_CHACHA20POLY1305 = encapsulation.AEAD_CHACHA20POLY1305
ENC_LEN = encapsulation.ENC_LEN  # uncompressed SEC1 point
PROOF_LEN = 64  # c || z
PARTIAL_LEN = 33 + PROOF_LEN  # compressed D_i || proof
_DLEQ_LABEL = b"verinfer/kms/dleq/p256/v1"

RandBelow = Callable[[int], int]

_G = ECC.construct(curve=CURVE, d=1).pointQ
_G_ENC = bytes.fromhex("036b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296")


class PointError(InvalidShareError):
    """Bytes that are not an acceptable P-256 point (typed; never an IndexError)."""


def point(data: bytes, what: str = "point") -> ECC.EccPoint:
    """Parse SEC1 bytes (33 compressed or 65 uncompressed) to a P-256 point other than the
    identity. pycryptodome's EccPoint constructor checks the point is on the curve; a
    compressed point is decompressed (and checked) by ``cryptography``. (ECC.import_key does
    the same at ~50x the cost; a verification parses several points.)"""
    if not isinstance(data, bytes | bytearray) or len(data) not in (33, 65):
        raise PointError(f"{what} must be a 33- or 65-byte SEC1 P-256 point")
    try:
        x, y = _coordinates(bytes(data))
        p = ECC.EccPoint(x, y, CURVE)
    except (ValueError, TypeError) as e:
        raise PointError(f"{what} is not a point on P-256: {e}") from None
    # (0, 0) is pycryptodome's identity; an identity E would make every D_i the identity
    # and every proof trivially true.
    if p.is_point_at_infinity():
        raise PointError(f"{what} is the point at infinity")
    return p


def _coordinates(data: bytes) -> tuple[int, int]:
    if data[0] == 4 and len(data) == 65:
        return int.from_bytes(data[1:33], "big"), int.from_bytes(data[33:], "big")
    if data[0] in (2, 3) and len(data) == 33:
        nums = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), data).public_numbers()
        return nums.x, nums.y
    raise ValueError(f"bad SEC1 prefix 0x{data[0]:02x} for {len(data)} bytes")


def encode(p: ECC.EccPoint, *, compressed: bool = True) -> bytes:
    if p.is_point_at_infinity():
        raise PointError("the point at infinity has no encoding")
    x, y = (int(c) for c in p.xy)
    if compressed:
        return bytes([2 + (y & 1)]) + x.to_bytes(32, "big")
    return b"\x04" + x.to_bytes(32, "big") + y.to_bytes(32, "big")


def base_mult(k: int) -> ECC.EccPoint:
    return _G * k


# ---- dealing (keygen only) ---------------------------------------------------------------

@dataclass(frozen=True)
class ScalarShare:
    index: int
    value: int  # f(index) mod N

    def __post_init__(self) -> None:
        if not 1 <= self.index <= MAX_SHARES:
            raise InvalidShareError(f"share index {self.index} not in 1..{MAX_SHARES}")
        if not 1 <= self.value < N:
            raise InvalidShareError(f"share {self.index}: value out of range [1, N)")

    def __repr__(self) -> str:  # never print share material
        return f"ScalarShare(index={self.index}, value=<redacted>)"


def deal(threshold: int, shares: int, rng: RandBelow
         ) -> tuple[bytes, list[ScalarShare], list[bytes]]:
    """Draw an epoch secret and share it t-of-n. Returns (public key as 65-byte uncompressed
    SEC1, shares, Feldman commitments as 33-byte compressed points). The secret itself is not
    returned: the only scalar that leaves is each shard's share."""
    if not 1 <= threshold <= shares <= MAX_SHARES:
        raise InvalidShareError(f"need 1 <= threshold <= shares <= {MAX_SHARES}, got "
                                f"threshold={threshold} shares={shares}")
    coeffs = [1 + rng(N - 1) for _ in range(threshold)]
    try:
        commitments = [encode(base_mult(a)) for a in coeffs]
        public = encode(base_mult(coeffs[0]), compressed=False)
        out = []
        for i in range(1, shares + 1):
            v = 0
            for a in reversed(coeffs):
                v = (v * i + a) % N
            if v == 0:  # probability ~n/2^256; a zero share would be refused by shards
                raise InvalidShareError("degenerate share drawn; run keygen again")
            out.append(ScalarShare(i, v))
    finally:
        for k in range(len(coeffs)):  # best effort: ints are immutable
            coeffs[k] = 0
    return public, out, commitments


# ---- verification keys -------------------------------------------------------------------

def parse_commitments(commitments: Sequence[bytes], threshold: int) -> list[ECC.EccPoint]:
    if len(commitments) != threshold:
        raise InvalidShareError(f"expected {threshold} commitments, got {len(commitments)}")
    return [point(c, f"commitment {j}") for j, c in enumerate(commitments)]


def verification_key(commitments: Sequence[ECC.EccPoint], index: int) -> ECC.EccPoint:
    """V_i = Σ_j index^j·C_j = s_i·G."""
    acc = commitments[0].copy()
    for j in range(1, len(commitments)):
        acc = acc + commitments[j] * pow(index, j, N)
    if acc.is_point_at_infinity():
        raise InvalidShareError(f"commitments give shard {index} no verification key")
    return acc


def check_share(share: ScalarShare, commitments: Sequence[ECC.EccPoint]) -> None:
    """A shard's own start-up check that its sealed share lies on the committed polynomial."""
    if encode(base_mult(share.value)) != encode(verification_key(commitments, share.index)):
        raise ShareVerificationError(
            f"share of shard {share.index} does not match the epoch commitments",
            shard_index=share.index)


# ---- partial decapsulation with a DLEQ proof ---------------------------------------------

def _challenge(v: bytes, enc: bytes, d: bytes, a: ECC.EccPoint, b: ECC.EccPoint,
               context: bytes) -> int:
    """c = H(label || lp(context) || G || V_i || E || D_i || A || B) mod N. V_i, D_i, A, B
    compressed; E as the 65 bytes of the envelope (already validated as a point). SHA-512
    reduced mod N: the bias is ~2^-256, unlike a 256-bit digest mod N."""
    h = hashlib.sha512(b"".join((
        _DLEQ_LABEL, len(context).to_bytes(4, "big"), context, _G_ENC, v, enc, d,
        encode(a), encode(b)))).digest()
    return int.from_bytes(h, "big") % N


def partial_decapsulate(share: ScalarShare, enc: bytes, context: bytes,
                        rng: RandBelow) -> bytes:
    """Shard side: D_i = s_i·E || Chaum–Pedersen proof (c, z) with z = k + c·s_i.
    ``context`` (the request's report_data and the shard index) is hashed into c, so a proof
    cannot be replayed for another request."""
    if len(enc) != ENC_LEN:
        raise PointError(f"encapsulated key must be {ENC_LEN} bytes")
    e = point(enc, "encapsulated key")
    d = encode(e * share.value)
    k = 1 + rng(N - 1)
    c = _challenge(encode(base_mult(share.value)), bytes(enc), d, base_mult(k), e * k, context)
    z = (k + c * share.value) % N
    return d + c.to_bytes(32, "big") + z.to_bytes(32, "big")


def verify_partial(partial: bytes, *, index: int, enc: bytes,
                   verification: ECC.EccPoint, context: bytes) -> ECC.EccPoint:
    """Requester side: D_i if the proof shows D_i = s_i·E for the s_i behind V_i; else
    ShareVerificationError naming the shard."""
    def bad(why: str) -> ShareVerificationError:
        return ShareVerificationError(f"partial decryption from shard {index} {why}",
                                      shard_index=index)
    if not isinstance(partial, bytes | bytearray) or len(partial) != PARTIAL_LEN:
        raise bad(f"is not {PARTIAL_LEN} bytes")
    try:
        d = point(bytes(partial[:33]), "D_i")
    except PointError as err:
        raise bad(f"is not a point: {err.message}") from None
    c = int.from_bytes(partial[33:65], "big")
    z = int.from_bytes(partial[65:97], "big")
    if not (0 <= c < N and 0 <= z < N):
        raise bad("has a proof scalar out of range")
    if len(enc) != ENC_LEN:
        raise PointError(f"encapsulated key must be {ENC_LEN} bytes")
    e: ECC.EccPoint = point(enc, "encapsulated key")
    # A = z·G − c·V, B = z·E − c·D; pycryptodome has no subtraction, so add (N − c)·V.
    a = base_mult(z) + verification * ((N - c) % N)
    b = e * z + d * ((N - c) % N)
    if a.is_point_at_infinity() or b.is_point_at_infinity() or \
            _challenge(encode(verification), bytes(enc), bytes(partial[:33]), a, b,
                       context) != c:
        raise bad("fails its DLEQ proof (not s_i·E for the committed share)")
    return d


def lagrange_at_zero(indices: Sequence[int]) -> dict[int, int]:
    out = {}
    for i in indices:
        num, den = 1, 1
        for j in indices:
            if j != i:
                num = num * (-j) % N
                den = den * (i - j) % N
        out[i] = num * pow(den, -1, N) % N
    return out


def combine(partials: Mapping[int, ECC.EccPoint], threshold: int) -> ECC.EccPoint:
    """s·E = Σ λ_i·D_i over exactly t verified partials (interpolation of points, never of
    scalars). Fewer than t are refused: any t−1 are consistent with every s·E."""
    if len(partials) < threshold:
        raise NotEnoughSharesError(
            f"need {threshold} partial decryptions, have {len(partials)} ({sorted(partials)})")
    use = sorted(partials)[:threshold]
    lam = lagrange_at_zero(use)
    acc: ECC.EccPoint | None = None
    for i in use:
        term = partials[i] * lam[i]
        acc = term if acc is None else acc + term
    assert acc is not None
    if acc.is_point_at_infinity():
        raise InvalidShareError("combined partial decryptions give the point at infinity")
    return acc


# ---- RFC 9180: DHKEM(P-256) Decap from s·E, base-mode key schedule, single-shot open -----
# The labelled extract/expand, key schedule and AEAD live with the sealer
# (``verinfer.receipts.encapsulation``), so sealing and threshold opening share one copy.

KeySchedule = encapsulation.KeySchedule
key_schedule = encapsulation.key_schedule
aead_open = encapsulation.aead_open


def kem_shared_secret(dh_point: ECC.EccPoint, enc: bytes, pk_r: bytes) -> bytes:
    """DHKEM Decap after the DH: dh = x(s·E); ExtractAndExpand with kem_context = enc || pkRm."""
    return encapsulation.kem_shared_secret(int(dh_point.x).to_bytes(32, "big"), enc, pk_r)


def open_single_shot(dh_point: ECC.EccPoint, enc: bytes, pk_r: bytes, info: bytes,
                     ct: bytes, aead_id: int = AEAD_AES128GCM) -> bytes:
    """HPKE single-shot Open (base mode, empty aad) given s·E instead of s."""
    ks = key_schedule(kem_shared_secret(dh_point, enc, pk_r), info, aead_id)
    return aead_open(ks, aead_id, 0, b"", ct)
