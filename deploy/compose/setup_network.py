"""One-shot set-up of the compose network (deploy/compose/docker-compose.yml), run INSIDE the
pinned image so that the engine fingerprint it approves names that image's digest.

It deploys the contracts on the compose anvil, approves the model and this image's engine
fingerprint (and the software-enclave measurement), stakes the operator, provisions a 3-of-5
KMS whose shards listen on fixed loopback ports 9101-9105, registers its epoch, creates the
operator directory and writes the two launch scripts the kms-N and verifier-N services run.
Idempotent: <state>/setup.done (written last) means the network was set up already; a
set-up that died half way is redone from scratch in a fresh directory.
Anvil's dev accounts and the software enclave: a local network, not a production one.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from web3 import Web3

from verinfer.devnet.network import (
    deploy_network,
    devnet_params,
    provision_kms,
    register_epoch,
    roles,
)
from verinfer.engine.engine import Engine
from verinfer.engine.loader import resolve_model_path
from verinfer.kms.directory import ShardInfo, load_directory, upsert_shard
from verinfer.kms.local_cluster import ShardProcesses

SHARD_PORT_BASE = 9100
N_VERIFIERS = 4


def _wait_for_chain(w3: Web3, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not w3.is_connected():
        if time.monotonic() > deadline:
            sys.exit(f"setup: no chain at {w3.provider} after {timeout_s:.0f} s")
        time.sleep(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--rpc-url", required=True)
    ap.add_argument("--model", default="gemma3-270m")
    a = ap.parse_args()
    state: Path = a.state
    if (state / "setup.done").exists():
        print(f"setup: {state / 'setup.done'} exists, nothing to do")
        return
    if state.exists() and any(state.iterdir()):
        sys.exit(f"setup: {state} holds a half-done set-up: remove the volume and start again")
    state.mkdir(parents=True, exist_ok=True)
    w3 = Web3(Web3.HTTPProvider(a.rpc_url, request_kwargs={"timeout": 30}))
    _wait_for_chain(w3)
    model = resolve_model_path(a.model)
    engine = Engine.from_path(model)
    print(f"setup: approving model {engine.model_id} and engine fingerprint "
          f"{engine.fingerprint.hash} (image {engine.fingerprint.container_digest})")
    r = roles(N_VERIFIERS)
    d = deploy_network(w3, r, engine, devnet_params(committee_size=N_VERIFIERS))
    d.save(state / "deployment.json")
    lay = provision_kms(state / "kms", engine)
    for s in load_directory(lay.directory):  # fixed ports: the compose services name them
        url = f"http://127.0.0.1:{SHARD_PORT_BASE + s.index}"
        upsert_shard(lay.directory, ShardInfo(s.index, url, s.address))
    register_epoch(w3, d, r, lay)
    engine.close()

    env = {**os.environ, "VI_SETUP_OPERATOR_KEY": r.operator.key.hex()}
    subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(state / "operator"),
                    "--epochs-file", str(lay.registry), "--key-epoch", "1",
                    "--private-key-env", "VI_SETUP_OPERATOR_KEY", "--rpc-url", a.rpc_url,
                    "--deployment", str(state / "deployment.json"), "--da", "redis",
                    "--redis-url", "redis://127.0.0.1:6379/0"], env=env, check=True)

    # kms-shard.sh INDEX: the exact command line the local cluster uses for shard INDEX
    shards = ShardProcesses(lay)
    lines = ["#!/bin/sh", "# written by setup_network.py", "set -eu", 'case "$1" in']
    for s in load_directory(lay.directory):
        cmd = ["/usr/bin/python3.11", "-m", "verinfer", "kms", "shard", "serve",
               "--index", str(s.index), "--port", str(SHARD_PORT_BASE + s.index),
               "--data-dir", str(lay.data_dir(s.index)),
               "--seal-key-file", str(lay.seal_key_file(s.index)),
               "--registry", str(lay.registry), "--attestation-root", str(lay.root_pub),
               "--allow-insecure-software-enclave", "--allowlist", str(lay.allowlist),
               *shards.committee_args()]
        lines.append(f"  {s.index}) exec {shlex.join(cmd)} ;;")
    lines += ['  *) echo "kms-shard.sh: no shard $1" >&2; exit 2 ;;', "esac"]
    (state / "kms-shard.sh").write_text("\n".join(lines) + "\n")

    # verifier.sh I: verifier I with anvil dev account 3+I (staked on first start)
    lines = ["#!/bin/sh", "# written by setup_network.py", "set -eu", 'case "$1" in']
    for i, acct in enumerate(r.verifiers):
        cmd = ["/usr/bin/python3.11", "-m", "verinfer", "verifier", "run",
               "--rpc-url", a.rpc_url, "--deployment", str(state / "deployment.json"),
               "--model", a.model, "--kms-dir", str(lay.root),
               "--state-dir", str(state / f"verifier-{i}"),
               "--da-redis-url", "redis://127.0.0.1:6379/0"]
        key = f"VERINFER_CHAIN_PRIVATE_KEY={acct.key.hex()}"
        lines.append(f"  {i}) {key} exec {shlex.join(cmd)} ;;")
    lines += ['  *) echo "verifier.sh: no verifier $1" >&2; exit 2 ;;', "esac"]
    (state / "verifier.sh").write_text("\n".join(lines) + "\n")
    (state / "setup.done").write_text("ok\n")
    print(f"setup: network state in {state}")


if __name__ == "__main__":
    main()
