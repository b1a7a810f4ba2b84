"""The receipt as an EIP-712 typed struct, signed with the operator's secp256k1 key.

Digest computed here from the spec (keccak via eth_utils); tests cross-check it against
eth-account's ``encode_typed_data``. Signing uses libsecp256k1 (coincurve) over the digest:
RFC 6979 deterministic nonces and low-s, so the 65 bytes r||s||v (v in {27, 28}) equal what
eth-account's ``unsafe_sign_hash`` produces, ~100x faster than its pure-Python backend.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import coincurve
from eth_utils import keccak, to_checksum_address

from verinfer.protocol.errors import ReceiptFormatError, UnsupportedVersionError
from verinfer.protocol.fields import check_bytes, check_uint, parse_hex
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.errors import IssuedAtSkewError, SignatureError, WrongChainError

RECEIPT_VERSION = 1
DOMAIN_NAME = "verinfer"
DOMAIN_VERSION = "1"

RECEIPT_TYPE = ("Receipt(uint16 version,address operator,uint256 chainId,bytes32 modelId,"
                "bytes32 engineFingerprintHash,bytes32 reqHash,bytes32 outHash,uint64 keyEpoch,"
                "bytes32 ciphertextHash,uint64 issuedAt)")
DOMAIN_TYPE = ("EIP712Domain(string name,string version,uint256 chainId,"
               "address verifyingContract)")
RECEIPT_TYPEHASH = keccak(text=RECEIPT_TYPE)
DOMAIN_TYPEHASH = keccak(text=DOMAIN_TYPE)

# (EIP-712 name, solidity type, python attribute) in struct order.
RECEIPT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("version", "uint16", "version"),
    ("operator", "address", "operator"),
    ("chainId", "uint256", "chain_id"),
    ("modelId", "bytes32", "model_id"),
    ("engineFingerprintHash", "bytes32", "engine_fingerprint_hash"),
    ("reqHash", "bytes32", "req_hash"),
    ("outHash", "bytes32", "out_hash"),
    ("keyEpoch", "uint64", "key_epoch"),
    ("ciphertextHash", "bytes32", "ciphertext_hash"),
    ("issuedAt", "uint64", "issued_at"),
)
#: How far in the future a receipt's (or audit report's) issuedAt may lie, in seconds, before
#: a client refuses it: clocks drift, but a receipt from the future starts its publication and
#: challenge windows late (2^64 - 1: never), so it must not be accepted as evidence of anything.
#: The one home of ChallengeManager.MAX_CLOCK_SKEW's value on the Python side: a receipt dated
#: later than its batch commit + this, or than the chain's now + this when claimed, is invalid
#: and slashed at once, so clients refuse exactly what the chain slashes.
MAX_ISSUED_AT_SKEW_S = 300
_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def parse_address(value: object, field: str = "address") -> str:
    """0x + 40 hex digits -> checksummed address. Mixed case must be a valid checksum."""
    if not isinstance(value, str):
        parse_hex(value, 20, field)  # raises with the offending value
    return _parse_address_str(str(value), field)


@functools.lru_cache(maxsize=4096)  # checksumming is slow; a server sees few distinct addresses
def _parse_address_str(value: str, field: str) -> str:
    checksummed = to_checksum_address(parse_hex(value, 20, field))
    if value[2:] not in (value[2:].lower(), value[2:].upper()) and value != checksummed:
        raise ReceiptFormatError(f"{field} has a bad EIP-55 checksum: {value!r}", param=field)
    return checksummed


def _word_uint(v: int) -> bytes:
    return v.to_bytes(32, "big")


def _word_address(addr: str) -> bytes:
    return bytes(12) + parse_hex(addr, 20, "address")


@dataclass(frozen=True)
class Domain:
    chain_id: int
    verifying_contract: str  # ChallengeManager address
    name: str = DOMAIN_NAME
    version: str = DOMAIN_VERSION

    def __post_init__(self) -> None:
        check_uint(self.chain_id, 256, "chainId")
        object.__setattr__(self, "verifying_contract",
                           parse_address(self.verifying_contract, "verifyingContract"))

    @functools.cached_property
    def separator(self) -> bytes:
        return keccak(DOMAIN_TYPEHASH + keccak(text=self.name) + keccak(text=self.version)
                      + _word_uint(self.chain_id) + _word_address(self.verifying_contract))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "chainId": self.chain_id,
                "verifyingContract": self.verifying_contract}

    @classmethod
    def from_json(cls, data: object) -> Domain:
        """Strict parse of :meth:`to_json`; only verinfer v1 domains are accepted."""
        if not isinstance(data, Mapping) or set(data) != {"name", "version", "chainId",
                                                          "verifyingContract"}:
            raise ReceiptFormatError(f"bad EIP-712 domain {data!r}", param="domain")
        domain = cls(data["chainId"], data["verifyingContract"], data["name"], data["version"])
        if (domain.name, domain.version) != (DOMAIN_NAME, DOMAIN_VERSION):
            raise ReceiptFormatError(f"not a verinfer v1 domain: {data!r}", param="domain")
        return domain


@dataclass(frozen=True)
class Receipt:
    """One signed statement: this operator served exactly this request with exactly this output.

    Hash fields are 32 raw bytes; ``operator`` is normalized to its EIP-55 checksum form.
    """

    operator: str
    chain_id: int
    model_id: bytes
    engine_fingerprint_hash: bytes
    req_hash: bytes
    out_hash: bytes
    key_epoch: int
    ciphertext_hash: bytes
    issued_at: int
    version: int = RECEIPT_VERSION

    def __post_init__(self) -> None:
        check_uint(self.version, 16, "version")
        if self.version != RECEIPT_VERSION:
            raise UnsupportedVersionError(f"unknown receipt version {self.version!r}",
                                          param="version")
        object.__setattr__(self, "operator", parse_address(self.operator, "operator"))
        check_uint(self.chain_id, 256, "chainId")
        for name in ("model_id", "engine_fingerprint_hash", "req_hash", "out_hash",
                     "ciphertext_hash"):
            check_bytes(getattr(self, name), 32, name)
        check_uint(self.key_epoch, 64, "keyEpoch")
        check_uint(self.issued_at, 64, "issuedAt")

    @classmethod
    def create(cls, *, operator: str, chain_id: int, model_id: bytes,
               engine_fingerprint_hash: bytes, req_hash: bytes, out_hash: bytes, key_epoch: int,
               ciphertext_hash: bytes, now: Callable[[], float] = time.time) -> Receipt:
        """A receipt issued at ``int(now())``; the clock is injectable for tests."""
        return cls(operator=operator, chain_id=chain_id, model_id=model_id,
                   engine_fingerprint_hash=engine_fingerprint_hash, req_hash=req_hash,
                   out_hash=out_hash, key_epoch=key_epoch, ciphertext_hash=ciphertext_hash,
                   issued_at=int(now()))

    # ---- EIP-712 -----------------------------------------------------------------------------
    def encode_data(self) -> bytes:
        out = bytearray(RECEIPT_TYPEHASH)
        for _, typ, attr in RECEIPT_FIELDS:
            v = getattr(self, attr)
            if typ == "address":
                out += _word_address(v)
            elif typ == "bytes32":
                out += v
            else:
                out += _word_uint(v)
        return bytes(out)

    @property
    def struct_hash(self) -> bytes:
        return keccak(self.encode_data())

    def digest(self, domain: Domain) -> bytes:
        """The receipt id: keccak256(0x1901 || domainSeparator || structHash)."""
        return keccak(b"\x19\x01" + domain.separator + self.struct_hash)

    def message(self) -> dict[str, Any]:
        """EIP-712 message: ints as JSON numbers, bytes32 as 0x-hex, address checksummed."""
        msg: dict[str, Any] = {}
        for name, typ, attr in RECEIPT_FIELDS:
            v = getattr(self, attr)
            msg[name] = to_hex(v) if typ == "bytes32" else v
        return msg

    def as_typed_data(self, domain: Domain) -> dict[str, Any]:
        """Complete EIP-712 JSON (``eth_signTypedData_v4`` shape) any wallet library verifies."""
        return {
            "types": {
                "EIP712Domain": [{"name": "name", "type": "string"},
                                 {"name": "version", "type": "string"},
                                 {"name": "chainId", "type": "uint256"},
                                 {"name": "verifyingContract", "type": "address"}],
                "Receipt": [{"name": n, "type": t} for n, t, _ in RECEIPT_FIELDS],
            },
            "primaryType": "Receipt",
            "domain": domain.to_json(),
            "message": self.message(),
        }

    # ---- flat JSON (API responses, vectors) ----------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return self.message()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        if not isinstance(data, Mapping):
            raise ReceiptFormatError(f"a receipt must be a JSON object, got {data!r}")
        names = {n for n, _, _ in RECEIPT_FIELDS}
        if set(data) != names:
            raise ReceiptFormatError(
                f"receipt fields must be exactly {sorted(names)}, got {sorted(data)}")
        kw: dict[str, Any] = {}
        for name, typ, attr in RECEIPT_FIELDS:
            v = data[name]
            kw[attr] = parse_hex(v, 32, name) if typ == "bytes32" else v
        return cls(**kw)


# ---- signatures --------------------------------------------------------------------------------
def _private_key_bytes(private_key: bytes | str) -> bytes:
    raw = parse_hex(private_key, 32, "private_key") if isinstance(private_key, str) \
        else check_bytes(private_key, 32, "private_key")
    if not 0 < int.from_bytes(raw, "big") < _SECP256K1_N:
        raise ReceiptFormatError("private_key is not a valid secp256k1 scalar",
                                 param="private_key")
    return raw


def address_of(private_key: bytes | str) -> str:
    return ReceiptSigner(private_key).address


def sign_digest(digest: bytes, private_key: bytes | str) -> bytes:
    """65-byte r||s||v (v in {27, 28}, low-s, RFC 6979) over a 32-byte digest."""
    return ReceiptSigner(private_key).sign_digest(digest)


def recover_digest_signer(digest: bytes, signature: bytes) -> str:
    check_bytes(digest, 32, "digest")
    if not isinstance(signature, bytes) or len(signature) != 65:
        raise SignatureError(f"a signature must be 65 bytes r||s||v, got {signature!r}",
                             param="signature")
    r, s, v = (int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:64], "big"),
               signature[64])
    if v not in (27, 28):
        raise SignatureError(f"signature v must be 27 or 28, got {v}", param="signature")
    if not (0 < r < _SECP256K1_N and 0 < s <= _SECP256K1_N // 2):
        raise SignatureError("signature r/s out of range or high-s (malleable)",
                             param="signature")
    try:
        pub = coincurve.PublicKey.from_signature_and_message(
            signature[:64] + bytes([v - 27]), digest, hasher=None)
    except Exception as e:  # libsecp256k1 reports unrecoverable points as ValueError/Exception
        raise SignatureError(f"signature does not recover a public key: {e}",
                             param="signature") from None
    return to_checksum_address(keccak(pub.format(compressed=False)[1:])[-20:])


class ReceiptSigner:
    """The operator's signing key, parsed once (a server signs every response with it)."""

    def __init__(self, private_key: bytes | str) -> None:
        self._key = coincurve.PrivateKey(_private_key_bytes(private_key))
        pub = self._key.public_key.format(compressed=False)[1:]
        self.address: str = to_checksum_address(keccak(pub)[-20:])

    def __repr__(self) -> str:  # never print the key
        return f"ReceiptSigner(address={self.address})"

    def sign_digest(self, digest: bytes) -> bytes:
        check_bytes(digest, 32, "digest")
        sig = self._key.sign_recoverable(digest, hasher=None)
        return sig[:64] + bytes([sig[64] + 27])

    def sign(self, receipt: Receipt, domain: Domain) -> bytes:
        """Sign as the operator. The key must belong to ``receipt.operator``."""
        if receipt.operator != self.address:
            raise SignatureError(
                f"the signing key is not the receipt's operator {receipt.operator}",
                param="operator")
        return self.sign_digest(receipt.digest(domain))


def sign_receipt(receipt: Receipt, domain: Domain, private_key: bytes | str) -> bytes:
    """Sign as the operator. The key must belong to ``receipt.operator``."""
    return ReceiptSigner(private_key).sign(receipt, domain)


def recover_signer(receipt: Receipt, domain: Domain, signature: bytes) -> str:
    return recover_digest_signer(receipt.digest(domain), signature)


def check_receipt_domain(receipt: Receipt, domain: Domain,
                         chain_id: int | None = None) -> None:
    """The one chain rule: ``receipt.chainId == domain.chainId`` (== ``chain_id``, the id of the
    chain being read, where the caller knows it). Raises :class:`WrongChainError`.

    Why: the contracts check ``receipt.chainId == block.chainid`` in every dispute, while the
    signature only binds the domain's chainId. A receipt naming another chain verifies off chain
    yet can never be challenged or claimed, so an operator serving such receipts could return
    any output for free. The operator calls this before signing; every verifier of a receipt
    (``verify_receipt``, manifests, clients) calls it before trusting one."""
    if receipt.chain_id != domain.chain_id:
        raise WrongChainError(f"receipt names chainId {receipt.chain_id} but is signed under a "
                              f"domain for chainId {domain.chain_id}", param="chainId")
    if chain_id is not None and domain.chain_id != chain_id:
        raise WrongChainError(f"receipt is for chainId {domain.chain_id}, this chain is "
                              f"{chain_id}", param="chainId")


def check_issued_at(issued_at: int, now: float, *, skew_s: int = MAX_ISSUED_AT_SKEW_S,
                    what: str = "receipt") -> None:
    """Refuse an ``issuedAt`` more than ``skew_s`` seconds after ``now`` (unix seconds; the
    chain's clock where the caller has it). Python ints: 2^64 - 1 compares, never wraps."""
    if issued_at > int(now) + skew_s:
        raise IssuedAtSkewError(f"{what} issuedAt {issued_at} is more than {skew_s} s after "
                                f"now ({int(now)})", param="issuedAt")


def verify_receipt(receipt: Receipt, domain: Domain, signature: bytes,
                   expected_operator: str | None = None, *, chain_id: int | None = None) -> str:
    """Check the receipt is for the domain's chain (:func:`check_receipt_domain`, and for
    ``chain_id`` if given) and the signature recovers to the receipt's operator (and
    ``expected_operator`` if given).

    Returns the signer address; raises :class:`SignatureError` (:class:`WrongChainError` for
    the chain rule) otherwise.
    """
    check_receipt_domain(receipt, domain, chain_id)
    signer = recover_signer(receipt, domain, signature)
    want = receipt.operator
    if expected_operator is not None:
        expected = parse_address(expected_operator, "expected_operator")
        if expected != want:
            raise SignatureError(f"receipt operator {want} is not the expected {expected}",
                                 param="operator")
    if signer != want:
        raise SignatureError(f"signature recovers {signer}, not the operator {want}",
                             param="signature")
    return signer
