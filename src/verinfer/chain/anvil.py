"""Start and stop a real anvil process (npm @foundry-rs/anvil) on a free loopback port."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import httpx
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3

from verinfer.chain.artifacts import tool_path
from verinfer.chain.errors import AnvilError
from verinfer.ports import free_port

# anvil's well-known development mnemonic; its accounts are funded with 10000 ETH each.
DEV_MNEMONIC = "test test test test test test test test test test test junk"


def dev_accounts(n: int = 10) -> list[LocalAccount]:
    """The first `n` funded anvil accounts (publicly known keys: local use only)."""
    Account.enable_unaudited_hdwallet_features()
    return [Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}")
            for i in range(n)]


class Anvil:
    """A running anvil. Use as a context manager, or call `start`/`stop`."""

    def __init__(self, *, port: int | None = None, chain_id: int = 31337,
                 binary: Path | None = None, startup_timeout: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep,
                 extra_args: Sequence[str] = ()) -> None:
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)  # more anvil flags (the game's fixed genesis, fees)
        self.chain_id = chain_id
        self.binary = binary or tool_path("anvil")
        self.startup_timeout = startup_timeout
        self._sleep = sleep
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Anvil:
        if not self.binary.exists():
            raise AnvilError(f"{self.binary} not found: run scripts/bootstrap-contracts")
        self._proc = subprocess.Popen(
            [str(self.binary), "--host", "127.0.0.1", "--port", str(self.port),
             "--chain-id", str(self.chain_id), "--silent", *self.extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise AnvilError(f"anvil exited with {self._proc.returncode}: {err}")
            try:
                r = httpx.post(self.url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId",
                                               "params": []}, timeout=1.0)
                if r.status_code == 200 and int(r.json()["result"], 16) == self.chain_id:
                    return self
            except httpx.HTTPError:
                pass
            self._sleep(0.1)
        self.stop()
        raise AnvilError(f"anvil did not answer on {self.url} within {self.startup_timeout}s")

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None

    def __enter__(self) -> Anvil:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def web3(self) -> Web3:
        return Web3(Web3.HTTPProvider(self.url, request_kwargs={"timeout": 30}))


def increase_time(w3: Web3, seconds: int) -> None:
    """Moves the chain clock forward and mines one block (anvil/hardhat RPC)."""
    w3.provider.make_request("evm_increaseTime", [seconds])  # type: ignore[arg-type]
    w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]


def mine(w3: Web3, blocks: int) -> None:
    """Mines `blocks` empty blocks (anvil RPC)."""
    w3.provider.make_request("anvil_mine", [hex(blocks)])  # type: ignore[arg-type]
