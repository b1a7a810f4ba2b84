"""Jobs an enclave can run with the epoch key. A job is ``f(private_key, **args)``; the
verifier's re-execution job comes from the verifier part. Results leave the enclave, so a job
returns only what it means to disclose."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from verinfer.enclave.errors import JobError
from verinfer.protocol.hexutil import HexFormatError, parse_hex_lenient
from verinfer.receipts import envelope
from verinfer.receipts.envelope import EnvelopeBinding, EnvelopeContents
from verinfer.receipts.epoch_keys import EpochPrivateKey


def resolve_job(ref: str) -> Callable[..., Any]:
    """'package.module:function' -> the function."""
    mod_name, _, func_name = ref.partition(":")
    if not mod_name or not func_name:
        raise JobError(f"job reference must be 'module:function', got {ref!r}")
    try:
        func = getattr(importlib.import_module(mod_name), func_name)
    except (ImportError, AttributeError) as e:
        raise JobError(f"cannot resolve job {ref!r}: {e}") from e
    if not callable(func):
        raise JobError(f"job {ref!r} is not callable")
    return func


def open_blob(private_key: EpochPrivateKey, blob: bytes | str, info: bytes | str = b""
              ) -> bytes:
    """Decrypt a single-shot HPKE ciphertext (enc || ct) sent to the epoch public key.
    ``blob``/``info`` may be 0x-hex strings (as from ``verinfer enclave run --job-args``)."""
    blob, info = _bytes(blob, "blob"), _bytes(info, "info")
    try:
        return private_key.suite.hpke.decrypt(blob, private_key.hpke, info=info)
    except Exception as e:  # cryptography raises InvalidTag or ValueError
        raise JobError(f"cannot open blob with the epoch key: {type(e).__name__}") from e


def open_envelope(private_key: EpochPrivateKey, blob: bytes,
                  binding: EnvelopeBinding) -> EnvelopeContents:
    """Open a DA envelope bound to a receipt (receipts part's format) with the epoch key."""
    return envelope.open_envelope(blob, binding, private_key)


def _bytes(v: bytes | str, what: str) -> bytes:
    if isinstance(v, bytes):
        return v
    try:  # typed on a command line (--job-args): the 0x prefix is optional
        return parse_hex_lenient(v, None, what)
    except HexFormatError:
        raise JobError(f"{what} must be bytes or hex, got {v!r:.40}") from None
