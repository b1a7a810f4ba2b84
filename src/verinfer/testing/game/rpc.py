"""The game's fast path to anvil: batched JSON-RPC, ABI encoding from the forge artifacts, and
an anvil started for reproducible runs.

Every transaction of an attacker-controlled account is one ``eth_sendTransaction`` (anvil
impersonates any sender and mines it at once); a revert comes back as the RPC error of the gas
estimate, with its custom error decoded, and mines nothing. Reads are ``eth_call``s sent as one
JSON-RPC batch. The honest daemons keep their own path (web3 and ``TxSender``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import httpx
from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_utils import function_signature_to_4byte_selector

from verinfer.chain.anvil import Anvil
from verinfer.chain.artifacts import decode_revert, load_artifact
from verinfer.protocol.hexutil import parse_hex, to_hex

#: Genesis time of the game's anvil: fixed, so that block hashes (the committee seed) and
#: therefore whole runs repeat from their seed.
GENESIS_TIME = 1_800_000_000


class GameAnvil(Anvil):
    """``verinfer.chain.anvil.Anvil`` with a fixed genesis time, a zero base fee (gas moves ETH
    only to the block producer, so ETH is conserved among the accounts the game watches) and
    one-second blocks that ignore the wall clock."""

    def __init__(self) -> None:
        super().__init__(extra_args=("--timestamp", str(GENESIS_TIME), "--base-fee", "0",
                                     "--gas-price", "0", "--disable-min-priority-fee",
                                     "--code-size-limit", "100000"))


@dataclass(frozen=True)
class RpcError(Exception):
    """A JSON-RPC error answer (a revert carries its decoded custom error)."""

    message: str
    data: bytes = b""

    @property
    def error_name(self) -> str:
        return decode_revert(self.data)[0] if self.data else self.message[:60]

    def __str__(self) -> str:
        if self.data:
            name, args = decode_revert(self.data)
            return f"{name}{tuple(_short(a) for a in args)}"
        return self.message


def _short(a: Any) -> Any:
    if isinstance(a, bytes):
        return "0x" + a.hex()[:12]
    return a


def _type_str(p: dict[str, Any]) -> str:
    t = str(p["type"])
    if t.startswith("tuple"):
        return "(" + ",".join(_type_str(c) for c in p["components"]) + ")" + t[5:]
    return t


@dataclass(frozen=True)
class AbiFn:
    contract: str
    name: str
    inputs: tuple[dict[str, Any], ...]
    in_types: tuple[str, ...]
    out_types: tuple[str, ...]
    selector: bytes
    mutability: str

    def encode(self, args: tuple[Any, ...] | list[Any]) -> bytes:
        return self.selector + abi_encode(list(self.in_types), list(args))

    def decode(self, data: bytes) -> tuple[Any, ...]:
        return tuple(abi_decode(list(self.out_types), data))


@cache
def abi_functions(contract: str) -> dict[str, AbiFn]:
    """Every function of a contract's ABI by name (the contracts overload none)."""
    out: dict[str, AbiFn] = {}
    for e in load_artifact(contract).abi:
        if e.get("type") != "function":
            continue
        ins = tuple(_type_str(p) for p in e["inputs"])
        sig = f"{e['name']}({','.join(ins)})"
        out[e["name"]] = AbiFn(contract, e["name"], tuple(e["inputs"]), ins,
                               tuple(_type_str(p) for p in e["outputs"]),
                               function_signature_to_4byte_selector(sig), e["stateMutability"])
    return out


class Rpc:
    """JSON-RPC over one keep-alive connection; ``batch`` sends many requests in one POST."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=60.0)
        self.calls = 0

    def close(self) -> None:
        self.http.close()

    def batch(self, reqs: list[tuple[str, list[Any]]]) -> list[Any]:
        """Results in request order; an error answer is returned as an RpcError (not raised)."""
        if not reqs:
            return []
        body = [{"jsonrpc": "2.0", "id": i, "method": m, "params": p}
                for i, (m, p) in enumerate(reqs)]
        self.calls += len(reqs)
        answers = self.http.post(self.url, json=body).json()
        by_id = {a["id"]: a for a in answers}
        out: list[Any] = []
        for i in range(len(reqs)):
            a = by_id[i]
            if "error" in a:
                err = a["error"]
                data = err.get("data")
                raw = parse_hex(data, None, "revert data") if isinstance(data, str) and \
                    data.startswith("0x") else b""
                out.append(RpcError(str(err.get("message", "")), raw))
            else:
                out.append(a["result"])
        return out

    def req(self, method: str, params: list[Any]) -> Any:
        r = self.batch([(method, params)])[0]
        if isinstance(r, RpcError):
            raise r
        return r

    # ---- contracts ----------------------------------------------------------------------

    @staticmethod
    def call_req(to: str, fn: AbiFn, args: tuple[Any, ...] | list[Any]) -> tuple[str, list[Any]]:
        return ("eth_call", [{"to": to, "data": to_hex(fn.encode(args))}, "latest"])

    def send(self, sender: str, to: str, data: bytes, value: int = 0) -> dict[str, Any]:
        """Sends and mines one transaction from any address (anvil impersonates it); returns its
        receipt. A revert raises RpcError with the decoded custom error; nothing is mined."""
        tx = {"from": sender, "to": to, "data": to_hex(data), "value": hex(value),
              "gasPrice": "0x0"}
        # anvil mines a reverting transaction too (and loses its error): estimate first
        gas = self.req("eth_estimateGas", [tx, "latest"])
        h = self.req("eth_sendTransaction", [{**tx, "gas": gas}])
        rec: dict[str, Any] | None = self.req("eth_getTransactionReceipt", [h])
        for _ in range(1000):  # automine answers before the block is stored, now and then
            if rec is not None:
                break
            time.sleep(0.002)
            rec = self.req("eth_getTransactionReceipt", [h])
        if rec is None:
            raise RpcError(f"transaction {h} not mined")
        if int(rec["status"], 16) != 1:
            raise RpcError("mined but failed", b"")
        return rec
