"""The whole flow from the command line down, then a disk sweep: keygen (CLI), shard
identities (CLI), five shard processes, an operator-style envelope holding a canary, and a
SoftwareEnclave child process that obtains the key and opens the envelope. The canary must
end up only in the job's in-memory result — in no file under the test's directories."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from eth_account import Account

from verinfer.enclave.process import EnclaveSpec, SoftwareEnclave
from verinfer.enclave.runner import AccountSigner
from verinfer.kms.app_keys import LEGACY_SUITE
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.local_cluster import ClusterLayout, ShardProcesses
from verinfer.kms.release_log import verify_release_log
from verinfer.ports import free_port
from verinfer.protocol.exec_request import ExecRequest
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.envelope import EnvelopeBinding, EnvelopeContents, seal
from verinfer.receipts.epoch_keys import load_public_key

ARGS = ("sha256:" + "44" * 32, "code-v1", "engine-fp")
OPERATOR = "0x" + "ab" * 20


def cli(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "verinfer", *args], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_canary_never_reaches_disk(tmp_path: Path) -> None:
    canary = "CANARY-" + hashlib.sha256(tmp_path.name.encode()).hexdigest()[:24]
    root = tmp_path / "kms"
    lay = ClusterLayout(root, 5)
    member = Account.create()

    cli("enclave", "root-keygen", "--out", str(lay.root_key.parent))
    # The legacy share-release suite: this test's child rebuilds the epoch key in memory, the
    # path where a leak to disk would hurt most (per-receipt epochs never hold that key).
    cli("kms", "keygen", "--epoch", "1", "--threshold", "3", "--shares", "5", "--out",
        str(root), "--seal-keys", str(root / "seal-keys"), "--registry", str(lay.registry),
        "--suite", LEGACY_SUITE)
    for i in range(1, 6):
        cli("kms", "shard", "init", "--index", str(i), "--data-dir", str(lay.data_dir(i)),
            "--url", f"http://127.0.0.1:{free_port()}", "--directory", str(lay.directory),
            "--seal-key-file", str(lay.seal_key_file(i)))
    m = cli("enclave", "measure", "--container-digest", ARGS[0], "--code-hash", ARGS[1],
            "--engine-fingerprint", ARGS[2])
    lay.allowlist.write_text(json.dumps({"measurements": [m]}))
    lay.committee.write_text(json.dumps({"verifiers": [member.address], "challenges": {
        "c1": {"status": "open", "committee": [member.address]}}}))

    rec = FileEpochRegistry(lay.registry).get(1)
    req = ExecRequest(model_id=bytes(range(32)), tokenizer_hash=bytes(32),
                      engine_fingerprint="{}", prompt_token_ids=(1, 2, 3), max_tokens=8,
                      temperature=0.0, top_k=0, top_p=1.0, stop=(), seed=1, ignore_eos=False)
    res = ExecResult(output_token_ids=(4, 5), finish_reason="length", logit_digest=bytes(32),
                     text_sha256=hashlib.sha256(b"ab").digest())
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": canary}]})
    binding = EnvelopeBinding.for_execution(operator=OPERATOR, chain_id=31337, key_epoch=1,
                                            request=req, result=res)
    blob = seal(EnvelopeContents(req, res, body.encode(), b'{"choices":[]}'), binding,
                load_public_key(rec.suite, rec.public_key_bytes))
    (tmp_path / "da").mkdir()
    (tmp_path / "da" / "blob.bin").write_bytes(blob)  # what DA would hold

    with ShardProcesses(lay) as procs:
        procs.start()
        enclave = SoftwareEnclave(
            EnclaveSpec(root_key=lay.root_key, container_digest=ARGS[0], code_hash=ARGS[1],
                        engine_fingerprint=ARGS[2], directory=lay.directory,
                        registry=lay.registry),
            AccountSigner(member))
        out = enclave.run("verinfer.enclave.jobs:open_envelope",
                          {"blob": blob, "binding": binding}, epoch=1,
                          purpose="full_challenge", challenge_id="c1")
    assert isinstance(out.result, EnvelopeContents)
    assert canary in out.result.request_body.decode()
    assert len(out.shards_used) == 3

    forms = [canary.encode(), canary.encode().hex().encode(),
             base64.b64encode(canary.encode())[:24]]
    swept = 0
    for f in tmp_path.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            swept += 1
            for form in forms:
                assert form not in data, f"canary found in {f}"
    assert swept >= 5 * 3  # sealed shares, identities, release logs, server logs, ...
    for i in range(1, 6):
        verify_release_log(lay.release_log(i))
    assert sum(lay.release_log(i).exists() for i in range(1, 6)) >= 3
