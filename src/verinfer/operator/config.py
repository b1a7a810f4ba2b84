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
     "sink": {"kind": "jsonl", "path": "batches.jsonl"},  # or {"kind": "chain",
                                                          #  "rpc_url": …, "deployment": …}
     "backpressure": {...},              # optional: BackpressureSection
     "stream": {...},                    # optional: StreamSection (replicas + a committer)
     "kms_provisioned_locally": false}   # `operator init` provisioned a demo KMS in the dir

Relative paths are relative to the directory holding operator.json. The file is parsed once,
into the pydantic models below: a missing, misspelt or out-of-range key is an
:class:`OperatorConfigError` naming it, and every reader gets typed fields.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from verinfer.errors import InvalidRequestError

CONFIG_NAME = "operator.json"
PASSWORD_ENV = "VERINFER_KEYSTORE_PASSWORD"


class OperatorConfigError(InvalidRequestError):
    code = "operator_config"


class _Section(BaseModel):
    # A misspelt key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DASection(_Section):
    """Where the DA backends live (``verinfer.da_client.factory.DAConfig``) and which one the
    operator publishes to first."""

    backend: Literal["local", "redis", "eigenda"]
    local_store: str | None = None  # relative to the config's directory
    redis_url: str | None = None
    redis_prefix: str = "verinfer:da:"
    redis_retention_s: int | None = Field(default=14 * 24 * 3600, gt=0)
    eigenda_url: str | None = None


class BatchSection(_Section):
    max_entries: int = Field(default=1024, gt=0)
    max_age_s: float = Field(default=5.0, gt=0)


class JsonlSink(_Section):
    """Batches to a local JSON-lines file: nothing on chain can challenge these receipts."""

    kind: Literal["jsonl"]
    path: str


class ChainSink(_Section):
    """Batches committed to the BatchRegistry of a deployment."""

    kind: Literal["chain"]
    rpc_url: str
    deployment: str  # deployment.json


SinkSection = Annotated[JsonlSink | ChainSink, Field(discriminator="kind")]


class BackpressureSection(_Section):
    """When signing stops (docs/operator.md): ``None`` = the runtime's default (the chain's
    publication deadline when a chain is bound)."""

    publication_deadline_s: float | None = Field(default=None, gt=0)
    stop_after_s: float | None = Field(default=None, gt=0)
    max_pending: int = Field(default=100_000, gt=0)
    identity_interval_s: float = Field(default=30.0, gt=0)
    check_interval_s: float = Field(default=1.0, gt=0)


class StreamSection(_Section):
    """Serving replicas and one batch committer (docs/deploy.md "Replicas and the
    committer"): with this section ``verinfer operator serve`` publishes every receipt to the
    operator's Redis receipt stream instead of committing batches itself, and ``verinfer
    operator commit`` (with a standby) commits them. ``local_copy`` also keeps each receipt in
    the replica's own outbox (a local record; that outbox is never published from, so no
    receipt is ever in two batches)."""

    redis_url: str
    prefix: str = "verinfer:operator:"
    replica: str | None = None  # the name entries carry; default: the host name and pid
    local_copy: bool = False
    max_backlog: int = Field(default=100_000, gt=0)
    call_deadline_s: float = Field(default=2.0, gt=0)
    lease_ttl_s: float = Field(default=10.0, gt=0)
    max_buffer_bytes: int = Field(default=256 * 1024 * 1024, gt=0)

    @model_validator(mode="after")
    def _lease_outlives_calls(self) -> StreamSection:
        # a holder renews every third of the TTL; a renewal may take a whole call deadline
        if not self.lease_ttl_s > 3 * self.call_deadline_s:
            raise ValueError(f"lease_ttl_s ({self.lease_ttl_s:g}) must exceed 3 x "
                             f"call_deadline_s ({self.call_deadline_s:g})")
        return self


class OperatorConfig(_Section):
    """``operator.json``, checked once when loaded. Relative paths in it are relative to
    ``root``, the directory holding it."""

    version: Literal[1]
    keystore: str
    password_file: str | None = None
    chain_id: int = Field(ge=0)
    challenge_manager: str
    epochs_file: str
    key_epoch: int = Field(ge=0)
    outbox: str
    da: DASection
    batch: BatchSection
    sink: SinkSection
    backpressure: BackpressureSection = BackpressureSection()
    stream: StreamSection | None = None
    kms_provisioned_locally: bool = False
    _root: Path = PrivateAttr(default=Path("."))

    @property
    def root(self) -> Path:
        return self._root

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
        try:
            cfg = cls.model_validate(raw)
        except ValidationError as e:
            raise OperatorConfigError(f"{path}: " + "; ".join(
                f"{'.'.join(str(x) for x in err['loc']) or '(top)'}: {err['msg']}"
                for err in e.errors())) from None
        cfg._root = directory
        return cfg

    def rel(self, value: str) -> Path:
        """A path from the file, resolved against the config's directory."""
        p = Path(value)
        return p if p.is_absolute() else self.root / p

    def password(self) -> str:
        if self.password_file:
            return self.rel(self.password_file).read_text().strip()
        pw = os.environ.get(PASSWORD_ENV)
        if pw is None:
            raise OperatorConfigError(f"no keystore password: set ${PASSWORD_ENV} or "
                                      "password_file in operator.json")
        return pw

    def private_key(self) -> bytes:
        from eth_account import Account

        try:
            return bytes(Account.decrypt(json.loads(self.rel(self.keystore).read_text()),
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
