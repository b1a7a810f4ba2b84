"""DHKEM(P-256, HKDF-SHA256) sealing that keeps its ephemeral secret long enough to prove it
knew it, and the check of that proof.

Why. A per-receipt epoch's envelopes are opened by KMS shards that each compute s_i·E for the
encapsulated key E read out of the envelope (``verinfer.kms.tdh``). E is written by the sealer
(the operator). Without more, an operator could publish a receipt whose envelope carries
*another* envelope's E; a challenge of that receipt would then give the committee s·E for the
other envelope, while every release log names only the receipt challenged. So the sealer
proves knowledge of e = log_G(E) (Schnorr, made non-interactive by Fiat–Shamir; the same
device as TDH2, Shoup–Gennaro 1998), with the challenge hashed over the envelope's context (its
header, the receipt binding, the AEAD ciphertext): whoever did not draw e cannot produce a
proof for E under any other context, and a copied proof verifies only for the envelope it was
made for.

Proof, for E = e·G (65-byte uncompressed SEC1) and context bytes ctx::

    k uniform in [1, n), A = k·G
    c = SHA-512("verinfer/envelope/encapsulation-pok/p256/v1" || u32 len(ctx) || ctx
                || G || E || A) mod n          (G, A uncompressed)
    z = k + c·e mod n                            proof = c (32) || z (32)

Check: E a P-256 point other than the identity, c, z < n, A' = z·G − c·E not the identity,
and the hash of A' gives c back.

Sealing (RFC 9180 base mode, single shot): e drawn by ``cryptography`` (OpenSSL), dh = ECDH(e,
pkR), shared_secret = ExtractAndExpand(dh, enc || pkR), the base-mode key schedule, AES-128-GCM
seal of message 0 with empty aad. The output enc || ct is byte for byte what any RFC 9180
implementation produces and opens (tests: the RFC 9180 vectors, ``cryptography``'s own HPKE).
The only reason this module seals instead of ``cryptography.hazmat.primitives.hpke`` is that
the latter never hands out e.

Group arithmetic: ``cryptography`` for the prover's k·G and the ECDH, pycryptodome's
``Crypto.PublicKey.ECC`` (points checked on the curve on construction) for the verifier's
z·G − c·E. HKDF/HMAC and AES-GCM from ``cryptography``. No hand-written curve code.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from Crypto.PublicKey import ECC
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from verinfer.receipts.errors import (
    EncapsulationMalformedError,
    EncapsulationProofError,
)

#: P-256 group order and field prime (FIPS 186-4 D.1.2.3).
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
CURVE = "P-256"
KEM_ID = 0x0010  # DHKEM(P-256, HKDF-SHA256)
KDF_ID = 0x0001  # HKDF-SHA256
AEAD_AES128GCM = 0x0001
AEAD_CHACHA20POLY1305 = 0x0003
_AEADS: dict[int, tuple[int, int]] = {AEAD_AES128GCM: (16, 12), AEAD_CHACHA20POLY1305: (32, 12)}
ENC_LEN = 65  # uncompressed SEC1 point
PROOF_LEN = 64  # c || z
POK_LABEL = b"verinfer/envelope/encapsulation-pok/p256/v1"

RandBelow = Callable[[int], int]

_G = ECC.construct(curve=CURVE, d=1).pointQ
_G_UNCOMPRESSED = (b"\x04" + int(_G.x).to_bytes(32, "big") + int(_G.y).to_bytes(32, "big"))


# ---- RFC 9180 pieces shared by the sender (here) and the threshold opener (kms/tdh) -------

def labeled_extract(suite_id: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    # HKDF-Extract(salt, ikm) = HMAC-SHA256(salt or zeros, ikm) (RFC 5869 §2.2)
    return hmac.new(salt or bytes(32), b"HPKE-v1" + suite_id + label + ikm,
                    hashlib.sha256).digest()


def labeled_expand(suite_id: bytes, prk: bytes, label: bytes, info: bytes, length: int
                   ) -> bytes:
    labeled = length.to_bytes(2, "big") + b"HPKE-v1" + suite_id + label + info
    return HKDFExpand(hashes.SHA256(), length, labeled).derive(prk)


def kem_shared_secret(dh: bytes, enc: bytes, pk_r: bytes) -> bytes:
    """DHKEM ExtractAndExpand: dh is the 32-byte x coordinate, kem_context = enc || pkRm."""
    suite = b"KEM" + KEM_ID.to_bytes(2, "big")
    prk = labeled_extract(suite, b"", b"eae_prk", dh)
    return labeled_expand(suite, prk, b"shared_secret", enc + pk_r, 32)


@dataclass(frozen=True, repr=False)
class KeySchedule:
    key: bytes
    base_nonce: bytes
    exporter_secret: bytes


def key_schedule(shared_secret: bytes, info: bytes, aead_id: int) -> KeySchedule:
    """RFC 9180 §5.1, mode_base (no PSK)."""
    if aead_id not in _AEADS:
        raise ValueError(f"unsupported AEAD id {aead_id}")
    nk, nn = _AEADS[aead_id]
    suite = (b"HPKE" + KEM_ID.to_bytes(2, "big") + KDF_ID.to_bytes(2, "big")
             + aead_id.to_bytes(2, "big"))
    psk_id_hash = labeled_extract(suite, b"", b"psk_id_hash", b"")
    info_hash = labeled_extract(suite, b"", b"info_hash", info)
    ctx = b"\x00" + psk_id_hash + info_hash
    secret = labeled_extract(suite, shared_secret, b"secret", b"")
    return KeySchedule(key=labeled_expand(suite, secret, b"key", ctx, nk),
                       base_nonce=labeled_expand(suite, secret, b"base_nonce", ctx, nn),
                       exporter_secret=labeled_expand(suite, secret, b"exp", ctx, 32))


def _aead(ks: KeySchedule, aead_id: int, seq: int) -> tuple[AESGCM | ChaCha20Poly1305, bytes]:
    nn = len(ks.base_nonce)
    nonce = bytes(a ^ b for a, b in zip(ks.base_nonce, seq.to_bytes(nn, "big"), strict=True))
    return (AESGCM(ks.key) if aead_id == AEAD_AES128GCM else ChaCha20Poly1305(ks.key)), nonce


def aead_open(ks: KeySchedule, aead_id: int, seq: int, aad: bytes, ct: bytes) -> bytes:
    """Open message number ``seq`` of the context (nonce = base_nonce XOR I2OSP(seq, Nn)).
    Raises cryptography's InvalidTag on a wrong key or tampered ciphertext."""
    cipher, nonce = _aead(ks, aead_id, seq)
    return cipher.decrypt(nonce, ct, aad)


def aead_seal(ks: KeySchedule, aead_id: int, seq: int, aad: bytes, pt: bytes) -> bytes:
    cipher, nonce = _aead(ks, aead_id, seq)
    return cipher.encrypt(nonce, pt, aad)


# ---- the proof of knowledge of e = log_G(E) ------------------------------------------------

def parse_enc(enc: bytes) -> ECC.EccPoint:
    """E as a P-256 point: 65 bytes, uncompressed, on the curve, not the identity (which
    pycryptodome would read from ``04 || 0^64``: an identity E makes every s_i·E the identity)."""
    if not isinstance(enc, bytes | bytearray) or len(enc) != ENC_LEN or enc[0] != 4:
        raise EncapsulationMalformedError(
            f"encapsulated key must be a {ENC_LEN}-byte uncompressed SEC1 P-256 point")
    x, y = int.from_bytes(enc[1:33], "big"), int.from_bytes(enc[33:], "big")
    if not (x < _P and y < _P):  # one encoding per point: the bytes are hashed and recorded
        raise EncapsulationMalformedError("encapsulated key has a coordinate >= p")
    try:
        p = ECC.EccPoint(x, y, CURVE)
    except ValueError as e:
        raise EncapsulationMalformedError(
            f"encapsulated key is not a point on P-256: {e}") from None
    if p.is_point_at_infinity():
        raise EncapsulationMalformedError("encapsulated key is the point at infinity")
    return p


def _challenge(enc: bytes, a: bytes, context: bytes) -> int:
    """SHA-512 reduced mod n (bias ~2^-256)."""
    h = hashlib.sha512(b"".join((POK_LABEL, len(context).to_bytes(4, "big"), context,
                                 _G_UNCOMPRESSED, bytes(enc), a))).digest()
    return int.from_bytes(h, "big") % N


def _uncompressed(p: ECC.EccPoint) -> bytes:
    return b"\x04" + int(p.x).to_bytes(32, "big") + int(p.y).to_bytes(32, "big")


def prove_encapsulation(e: ec.EllipticCurvePrivateKey, context: bytes,
                        rng: RandBelow = secrets.randbelow) -> bytes:
    """The proof (c || z) that the holder of ``e`` made E = e·G for ``context``."""
    enc = e.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    k = 1 + rng(N - 1)
    a = ec.derive_private_key(k, ec.SECP256R1()).public_key().public_bytes(
        Encoding.X962, PublicFormat.UncompressedPoint)
    c = _challenge(enc, a, context)
    z = (k + c * e.private_numbers().private_value) % N
    return c.to_bytes(32, "big") + z.to_bytes(32, "big")


def verify_encapsulation(enc: bytes, proof: bytes, context: bytes) -> None:
    """Raise unless ``proof`` shows its maker knew log_G(E) and made it for ``context``.
    :class:`EncapsulationMalformedError` for bytes that cannot be a key or proof,
    :class:`EncapsulationProofError` for a well-formed proof that does not verify (made for
    another context — another envelope or receipt — or forged)."""
    e = parse_enc(enc)
    if not isinstance(proof, bytes | bytearray) or len(proof) != PROOF_LEN:
        raise EncapsulationMalformedError(f"encapsulation proof must be {PROOF_LEN} bytes")
    c = int.from_bytes(proof[:32], "big")
    z = int.from_bytes(proof[32:], "big")
    if not (c < N and z < N):
        raise EncapsulationMalformedError("encapsulation proof has a scalar out of range")
    # A' = z·G − c·E; pycryptodome has no subtraction: add (n − c)·E.
    a = _G * z + e * ((N - c) % N)
    if a.is_point_at_infinity() or _challenge(enc, _uncompressed(a), context) != c:
        raise EncapsulationProofError(
            "encapsulation proof does not verify for this envelope and receipt (made for "
            "another one, or forged)")


# ---- sealing --------------------------------------------------------------------------------

def seal(plaintext: bytes, pk_r: ec.EllipticCurvePublicKey, info: bytes,
         context: Callable[[bytes, bytes], bytes], *,
         rng: RandBelow = secrets.randbelow) -> tuple[bytes, bytes, bytes]:
    """RFC 9180 single-shot Seal (base mode, AES-128-GCM, empty aad) to ``pk_r``, plus the
    proof of knowledge of the ephemeral secret bound to ``context(enc, ct)``. Returns
    (enc, proof, ct). The ephemeral key lives in this call only."""
    eph = ec.generate_private_key(ec.SECP256R1())
    enc = eph.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    pk_bytes = pk_r.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
    dh = eph.exchange(ec.ECDH(), pk_r)
    ks = key_schedule(kem_shared_secret(dh, enc, pk_bytes), info, AEAD_AES128GCM)
    ct = aead_seal(ks, AEAD_AES128GCM, 0, b"", plaintext)
    proof = prove_encapsulation(eph, context(enc, ct), rng)
    del eph
    return enc, proof, ct
