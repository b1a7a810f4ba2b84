"""HPKE key pairs of a key epoch, derived deterministically from a 32-byte secret seed.

The KMS shares the seed (t-of-n Shamir); whoever reconstructs it calls
:func:`derive_epoch_keypair`. Derivation (HKDF-SHA256, empty salt, IKM = seed):

    x25519 private = HKDF(seed, info = LABEL || suite.value || b"/x25519", 32)
    ML-KEM-768 seed = HKDF(seed, info = LABEL || suite.value || b"/mlkem768", 64)   (hybrid only)

The suite name is in the info so the same seed never yields related keys for two suites.
Public key bytes: X25519 -> the 32 raw bytes; MLKEM768_X25519 -> ML-KEM-768 encapsulation key
(1184 bytes) || X25519 public key (32 bytes), the order of the hybrid KEM drafts;
P256 -> the 65-byte uncompressed SEC1 point.

P256 (DHKEM(P-256, HKDF-SHA256), HKDF-SHA256, AES-128-GCM) is the threshold suite: its private
key is the epoch secret s itself (seed = s, 32 bytes big-endian, 1 <= s < n), Shamir-shared by
the KMS, and envelopes to it are opened share by share (``verinfer.kms.tdh``) without anyone
rebuilding s. :func:`derive_epoch_keypair` accepts it only so tests can open with the full key.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import hpke as _hpke
from cryptography.hazmat.primitives.asymmetric import ec, mlkem, x25519
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from verinfer.protocol.errors import ReceiptFormatError

LABEL = b"verinfer/epoch-key/v1/"
MLKEM768_PUBLIC_LEN = 1184
X25519_LEN = 32
P256_PUBLIC_LEN = 65
#: P-256 group order: a P256 seed is a scalar below it.
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


class EnvelopeSuite(enum.Enum):
    """HPKE suites an epoch may use. Values are the stable names stored in epoch records."""

    X25519 = "x25519-hkdf-sha256-aes256gcm"
    MLKEM768_X25519 = "mlkem768x25519-hkdf-sha256-aes256gcm"
    P256 = "p256-hkdf-sha256-aes128gcm"

    @property
    def suite_id(self) -> bytes:
        """RFC 9180 suite_id: "HPKE" || kem_id || kdf_id || aead_id (u16 big-endian each).
        KEM 0x0020 = DHKEM(X25519, HKDF-SHA256); 0x647a = MLKEM768-X25519 (hybrid draft);
        0x0010 = DHKEM(P-256, HKDF-SHA256). AEAD 2 = AES-256-GCM, 1 = AES-128-GCM."""
        kem, aead = {EnvelopeSuite.X25519: (0x0020, 2), EnvelopeSuite.MLKEM768_X25519: (0x647A, 2),
                     EnvelopeSuite.P256: (0x0010, 1)}[self]
        return b"HPKE" + kem.to_bytes(2, "big") + (1).to_bytes(2, "big") + aead.to_bytes(2, "big")

    @property
    def hpke(self) -> _hpke.Suite:
        if self is EnvelopeSuite.P256:
            return _hpke.Suite(_hpke.KEM.P256, _hpke.KDF.HKDF_SHA256, _hpke.AEAD.AES_128_GCM)
        kem = _hpke.KEM.X25519 if self is EnvelopeSuite.X25519 else _hpke.KEM.MLKEM768_X25519
        return _hpke.Suite(kem, _hpke.KDF.HKDF_SHA256, _hpke.AEAD.AES_256_GCM)

    @property
    def threshold_decapsulable(self) -> bool:
        """Shards can open an envelope of this suite without anyone holding the epoch key
        (a DH KEM over a prime-order group). X25519 keys are not Shamir-shared (clamping),
        and ML-KEM decapsulation is not linear in the key: those epochs rebuild the key."""
        return self is EnvelopeSuite.P256

    @property
    def public_key_len(self) -> int:
        return {EnvelopeSuite.X25519: X25519_LEN, EnvelopeSuite.P256: P256_PUBLIC_LEN,
                EnvelopeSuite.MLKEM768_X25519: MLKEM768_PUBLIC_LEN + X25519_LEN}[self]

    @classmethod
    def parse(cls, value: EnvelopeSuite | str) -> EnvelopeSuite:
        if isinstance(value, EnvelopeSuite):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ReceiptFormatError(
                f"unknown envelope suite {value!r}; known: {[s.value for s in cls]}",
                param="suite") from None


HpkePublicKey = (x25519.X25519PublicKey | _hpke.MLKEM768X25519PublicKey
                 | ec.EllipticCurvePublicKey)
HpkePrivateKey = (x25519.X25519PrivateKey | _hpke.MLKEM768X25519PrivateKey
                  | ec.EllipticCurvePrivateKey)


@dataclass(frozen=True, eq=False)
class EpochPublicKey:
    suite: EnvelopeSuite
    raw: bytes  # see module doc for the layout
    hpke: HpkePublicKey

    def to_bytes(self) -> bytes:
        return self.raw

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, EpochPublicKey) and other.suite is self.suite
                and other.raw == self.raw)

    def __hash__(self) -> int:
        return hash((self.suite, self.raw))


@dataclass(frozen=True, eq=False, repr=False)
class EpochPrivateKey:
    suite: EnvelopeSuite
    hpke: HpkePrivateKey
    public: EpochPublicKey

    def public_key(self) -> EpochPublicKey:
        return self.public

    def __repr__(self) -> str:  # never print key material
        return f"EpochPrivateKey(suite={self.suite.value}, public=0x{self.public.raw[:8].hex()}..)"


def _hkdf(seed: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(seed)


def derive_epoch_keypair(seed: bytes, suite: EnvelopeSuite | str = EnvelopeSuite.X25519
                         ) -> tuple[EpochPrivateKey, EpochPublicKey]:
    """Deterministic HPKE key pair of an epoch from its 32-byte secret seed."""
    if not isinstance(seed, bytes | bytearray) or len(seed) != 32:
        got = f"{len(seed)} bytes" if isinstance(seed, bytes | bytearray) else repr(type(seed))
        raise ReceiptFormatError(f"an epoch seed must be 32 bytes, got {got}", param="seed")
    s = EnvelopeSuite.parse(suite)
    if s is EnvelopeSuite.P256:
        scalar = int.from_bytes(bytes(seed), "big")
        if not 1 <= scalar < P256_ORDER:
            raise ReceiptFormatError("a p256 epoch seed must be a scalar in [1, n)",
                                     param="seed")
        pk = ec.derive_private_key(scalar, ec.SECP256R1())
        raw = pk.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
        pub = EpochPublicKey(s, raw, pk.public_key())
        return EpochPrivateKey(s, pk, pub), pub
    base = LABEL + s.value.encode()
    xk = x25519.X25519PrivateKey.from_private_bytes(_hkdf(bytes(seed), base + b"/x25519", 32))
    x_pub = xk.public_key().public_bytes_raw()
    if s is EnvelopeSuite.X25519:
        pub = EpochPublicKey(s, x_pub, xk.public_key())
        return EpochPrivateKey(s, xk, pub), pub
    mk = mlkem.MLKEM768PrivateKey.from_seed_bytes(_hkdf(bytes(seed), base + b"/mlkem768", 64))
    m_pub = mk.public_key()
    pub = EpochPublicKey(s, m_pub.public_bytes_raw() + x_pub,
                         _hpke.MLKEM768X25519PublicKey(m_pub, xk.public_key()))
    return EpochPrivateKey(s, _hpke.MLKEM768X25519PrivateKey(mk, xk), pub), pub


def public_key_bytes(public_key: EpochPublicKey) -> bytes:
    return public_key.raw


def load_public_key(suite: EnvelopeSuite | str, data: bytes) -> EpochPublicKey:
    """Parse public key bytes of ``suite``; raises :class:`ReceiptFormatError` if malformed."""
    s = EnvelopeSuite.parse(suite)
    if not isinstance(data, bytes) or len(data) != s.public_key_len:
        raise ReceiptFormatError(
            f"a {s.value} public key is {s.public_key_len} bytes, got "
            f"{len(data) if isinstance(data, bytes) else type(data).__name__}", param="public_key")
    try:
        if s is EnvelopeSuite.P256:
            if data[0] != 4:  # uncompressed only: the bytes are hashed into HPKE's kem_context
                raise ValueError("not an uncompressed SEC1 point")
            return EpochPublicKey(
                s, data, ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), data))
        if s is EnvelopeSuite.X25519:
            return EpochPublicKey(s, data, x25519.X25519PublicKey.from_public_bytes(data))
        m_pub = mlkem.MLKEM768PublicKey.from_public_bytes(data[:MLKEM768_PUBLIC_LEN])
        x_pub = x25519.X25519PublicKey.from_public_bytes(data[MLKEM768_PUBLIC_LEN:])
    except ValueError as e:
        raise ReceiptFormatError(f"invalid {s.value} public key: {e}",
                                 param="public_key") from None
    return EpochPublicKey(s, data, _hpke.MLKEM768X25519PublicKey(m_pub, x_pub))
