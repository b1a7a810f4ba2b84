"""The operator's evidence configuration: ``<dir>/operator.json`` plus the files it names.

    {"version": 1,
     "keystore": "operator.keystore.json",       # eth-account keystore (v3 JSON)
     "password_file": "keystore.password",        # or null: $VERINFER_KEYSTORE_PASSWORD
     "chain_id": 31337, "challenge_manager": "0x…",   # the EIP-712 domain of every receipt
     "epochs_file": "kms/epochs.json", "key_epoch": 1,  # the app key envelopes are sealed to
     "outbox": "outbox.sqlite",
     "da": {"backend": "local", "local_store": "da", "redis_url": null,
            "redis_prefix": "verinfer:da:", "eigenda_url": null},
     "batch": {"max_entries": 1024, "max_age_s": 5.0},
     "sink": {"kind": "jsonl", "path": "batches.jsonl"}}   # or {"kind": "chain", …}

Relative paths are relative to the directory holding operator.json.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verinfer.errors import InvalidRequestError

CONFIG_NAME = "operator.json"
PASSWORD_ENV = "VERINFER_KEYSTORE_PASSWORD"


class OperatorConfigError(InvalidRequestError):
    code = "operator_config"


@dataclass(frozen=True)
class OperatorConfig:
    root: Path
    raw: dict[str, Any]

    @classmethod
    def load(cls, directory: Path) -> OperatorConfig:
        path = directory / CONFIG_NAME
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise OperatorConfigError(f"{path} does not exist: run `verinfer operator init "
                                      f"{directory}` first") from None
        except ValueError as e:
            raise OperatorConfigError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(raw, dict) or raw.get("version") != 1:
            raise OperatorConfigError(f"{path}: expected an object with version 1")
        for key in ("keystore", "chain_id", "challenge_manager", "epochs_file", "key_epoch",
                    "outbox", "da", "batch", "sink"):
            if key not in raw:
                raise OperatorConfigError(f"{path}: missing {key!r}")
        return cls(directory, raw)

    def path(self, key: str) -> Path:
        p = Path(self.raw[key])
        return p if p.is_absolute() else self.root / p

    def rel(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else self.root / p

    def password(self) -> str:
        if self.raw.get("password_file"):
            return self.rel(self.raw["password_file"]).read_text().strip()
        pw = os.environ.get(PASSWORD_ENV)
        if pw is None:
            raise OperatorConfigError(f"no keystore password: set ${PASSWORD_ENV} or "
                                      "password_file in operator.json")
        return pw

    def private_key(self) -> bytes:
        from eth_account import Account

        try:
            return bytes(Account.decrypt(json.loads(self.path("keystore").read_text()),
                                         self.password()))
        except (OSError, ValueError) as e:
            raise OperatorConfigError(f"cannot open the operator keystore: {e}") from None


def write_config(directory: Path, raw: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CONFIG_NAME
    path.write_text(json.dumps({"version": 1, **raw}, indent=2) + "\n")
    return path


def create_keystore(path: Path, private_key: bytes, password: str, *, light: bool = False
                    ) -> str:
    """Writes an eth-account v3 keystore (scrypt; ``light`` = cheap KDF for tests/devnets);
    returns the address."""
    from eth_account import Account

    kw: dict[str, Any] = {"kdf": "pbkdf2", "iterations": 1024} if light else {}
    ks = Account.encrypt(private_key, password, **kw)
    path.write_text(json.dumps(ks))
    os.chmod(path, 0o600)
    return str(Account.from_key(private_key).address)
