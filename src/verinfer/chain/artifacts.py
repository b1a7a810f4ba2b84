"""Compiled contract artifacts from `forge build` (contracts/out) and revert decoding.

The ABIs are build output, not committed: scripts/bootstrap (via scripts/bootstrap-contracts)
builds them, and `load_artifact` builds them on first use when they are missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address

from verinfer.chain.errors import ArtifactsMissingError
from verinfer.protocol.hexutil import parse_hex_lenient

CONTRACT_NAMES = ("ProtocolConfig", "StakeRegistry", "BatchRegistry", "ChallengeManager",
                  "AuditLog")


def contracts_dir() -> Path:
    """The Foundry project: $VERINFER_CONTRACTS_DIR or <repo>/contracts."""
    env = os.environ.get("VERINFER_CONTRACTS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "contracts"


def tool_path(name: str, root: Path | None = None) -> Path:
    """An npm-installed Foundry binary (forge, anvil)."""
    return (root or contracts_dir()) / "node_modules" / ".bin" / name


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: list[dict[str, Any]]
    bytecode: bytes


def build(root: Path | None = None) -> None:
    """Runs `forge build` in the Foundry project."""
    root = root or contracts_dir()
    forge = tool_path("forge", root)
    if not forge.exists():
        raise ArtifactsMissingError(f"{forge} not found: run scripts/bootstrap-contracts")
    proc = subprocess.run([str(forge), "build", "--quiet"], cwd=root, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise ArtifactsMissingError(f"forge build failed:\n{proc.stdout}\n{proc.stderr}")


@cache
def load_artifact(name: str, root: Path | None = None) -> Artifact:
    """ABI and creation bytecode of contract `name`, building once if needed."""
    if name not in CONTRACT_NAMES:
        raise ArtifactsMissingError(f"unknown contract {name!r}; known: {CONTRACT_NAMES}")
    root = root or contracts_dir()
    path = root / "out" / f"{name}.sol" / f"{name}.json"
    if not path.exists():
        build(root)
    if not path.exists():
        raise ArtifactsMissingError(f"{path} missing after forge build")
    data = json.loads(path.read_text())
    return Artifact(name=name, abi=data["abi"],
                    bytecode=parse_hex_lenient(data["bytecode"]["object"], None,
                                               f"{name} bytecode"))


def _canonical_type(param: dict[str, Any]) -> str:
    t = str(param["type"])
    if t.startswith("tuple"):
        inner = ",".join(_canonical_type(c) for c in param["components"])
        return f"({inner}){t[5:]}"
    return t


@cache
def error_table() -> dict[bytes, tuple[str, tuple[str, ...]]]:
    """selector -> (error name, argument types) over every verinfer contract and its bases."""
    table: dict[bytes, tuple[str, tuple[str, ...]]] = {}
    for name in CONTRACT_NAMES:
        for item in load_artifact(name).abi:
            if item.get("type") != "error":
                continue
            types = tuple(_canonical_type(p) for p in item["inputs"])
            sig = f"{item['name']}({','.join(types)})"
            table[keccak(text=sig)[:4]] = (item["name"], types)
    return table


def decode_revert(data: bytes) -> tuple[str, tuple[object, ...]]:
    """(error name, decoded args) of revert data; ('unknown', (data,)) when not ours."""
    if len(data) < 4:
        return ("empty", ())
    if data[:4] == keccak(text="Error(string)")[:4]:
        return ("Error", tuple(abi_decode(["string"], data[4:])))
    entry = error_table().get(data[:4])
    if entry is None:
        return ("unknown", (data,))
    name, types = entry
    values = abi_decode(list(types), data[4:])
    return (name, tuple(to_checksum_address(v) if t == "address" else v
                        for t, v in zip(types, values, strict=True)))
