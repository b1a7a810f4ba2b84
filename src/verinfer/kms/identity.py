"""A shard's identity: a secp256k1 Ethereum key (eth-account), sealed at rest.

Why secp256k1 rather than Ed25519: shard addresses can be registered in ProtocolConfig and a
signed release can be checked on chain with ``ecrecover`` (e.g. as evidence against a shard).
Signatures are EIP-191 personal_sign over a 32-byte digest, 65 bytes r||s||v.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount

from verinfer.kms.sealing import TokenBytes, read_sealed, write_sealed


def identity_label(index: int) -> str:
    return f"verinfer/kms/identity/v1:index={index}"


def identity_path(data_dir: Path) -> Path:
    return data_dir / "identity.key.sealed"


def load_or_create_identity(data_dir: Path, index: int, seal_key: bytes,
                            token_bytes: TokenBytes = secrets.token_bytes) -> LocalAccount:
    path = identity_path(data_dir)
    if path.exists():
        raw = read_sealed(path, seal_key, identity_label(index))
        try:
            acct: LocalAccount = Account.from_key(bytes(raw))
        finally:
            raw[:] = bytes(len(raw))
        return acct
    key = bytearray(token_bytes(32))
    try:
        acct = Account.from_key(bytes(key))
        write_sealed(path, seal_key, key, identity_label(index), token_bytes)
    finally:
        key[:] = bytes(len(key))
    (data_dir / "identity.json").write_text(
        json.dumps({"index": index, "address": acct.address}) + "\n")
    return acct


def sign_eip191(account: LocalAccount, digest: bytes) -> bytes:
    """The KMS identities' scheme: an EIP-191 personal-message signature over ``digest``
    (releases, log heads, requester and audit signatures). Receipts use another scheme, the
    raw EIP-712 digest signature (``verinfer.receipts.eip712.sign_digest``); the distinct
    names keep the two from being confused."""
    return bytes(account.sign_message(encode_defunct(primitive=digest)).signature)


def recover_eip191_signer(digest: bytes, signature: bytes) -> str:
    """The signer of :func:`sign_eip191`: lower-case 0x address; ValueError on garbage
    signatures."""
    try:
        addr: str = Account.recover_message(encode_defunct(primitive=digest),
                                            signature=signature)
    except Exception as e:  # eth-account raises several types for malformed signatures
        raise ValueError(f"unrecoverable signature: {e}") from e
    return addr.lower()


__all__ = ["identity_label", "load_or_create_identity", "recover_eip191_signer", "sign_eip191"]
