"""Sealing at rest: AES-256-GCM with a 32-byte key from a keyfile or an environment variable.

File format: b"VSEAL1" || 12-byte nonce || ciphertext+tag; the AAD is a label naming what the
file holds (e.g. "verinfer/kms/share/v1:epoch=3:index=2"), so a sealed file moved to another
name or shard fails to open instead of being misused.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from verinfer.kms.errors import SealError
from verinfer.protocol.hexutil import parse_hex_lenient

MAGIC = b"VSEAL1"
KEY_LEN = 32
TokenBytes = Callable[[int], bytes]


def seal(key: bytes | bytearray, plaintext: bytes | bytearray, label: str,
         token_bytes: TokenBytes = secrets.token_bytes) -> bytes:
    _check_key(key)
    nonce = token_bytes(12)
    return MAGIC + nonce + AESGCM(bytes(key)).encrypt(nonce, bytes(plaintext), label.encode())


def unseal(key: bytes | bytearray, blob: bytes, label: str) -> bytearray:
    _check_key(key)
    if len(blob) < len(MAGIC) + 12 + 16 or not blob.startswith(MAGIC):
        raise SealError(f"not a sealed blob (label {label!r})")
    nonce = blob[len(MAGIC):len(MAGIC) + 12]
    try:
        pt = AESGCM(bytes(key)).decrypt(nonce, blob[len(MAGIC) + 12:], label.encode())
    except InvalidTag as e:
        raise SealError(f"cannot unseal {label!r}: wrong seal key or tampered file") from e
    return bytearray(pt)


def write_sealed(path: Path, key: bytes | bytearray, plaintext: bytes | bytearray, label: str,
                 token_bytes: TokenBytes = secrets.token_bytes) -> None:
    _write_private(path, seal(key, plaintext, label, token_bytes))


def read_sealed(path: Path, key: bytes | bytearray, label: str) -> bytearray:
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise SealError(f"cannot read sealed file {path}: {e.strerror}") from e
    return unseal(key, blob, label)


def new_seal_key(path: Path, token_bytes: TokenBytes = secrets.token_bytes) -> bytes:
    """Create a keyfile (hex, mode 0600). Refuses to overwrite an existing one."""
    if path.exists():
        raise SealError(f"seal keyfile {path} already exists")
    key = token_bytes(KEY_LEN)
    _write_private(path, key.hex().encode() + b"\n")
    return key


def load_seal_key(keyfile: Path | None = None, env_var: str | None = None) -> bytes:
    """Keyfile wins over the environment; one of them must be given and valid."""
    if keyfile is not None:
        try:
            text = keyfile.read_text().strip()
        except OSError as e:
            raise SealError(f"cannot read seal keyfile {keyfile}: {e.strerror}") from e
        source = str(keyfile)
    elif env_var is not None and os.environ.get(env_var):
        text, source = os.environ[env_var].strip(), f"${env_var}"
    else:
        raise SealError(f"no seal key: give a keyfile or set ${env_var or 'VERINFER_SEAL_KEY'}")
    try:
        # typed or pasted by a person: the 0x prefix is optional (parse_hex_lenient)
        key = parse_hex_lenient(text, None, "seal key")
    except ValueError:  # never echo (part of) the key into the error
        raise SealError(f"seal key from {source} is not hex") from None
    _check_key(key)
    return key


def _check_key(key: bytes | bytearray) -> None:
    if len(key) != KEY_LEN:
        raise SealError(f"seal key must be {KEY_LEN} bytes, got {len(key)}")


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
