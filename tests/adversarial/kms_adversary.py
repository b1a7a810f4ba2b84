"""Shared pieces of the adversarial KMS tests: a provisioned cluster whose shard ``evil`` is the
malicious process of ``kms_evil_shard.py`` (on the port the directory lists for it) and the
others are real ``verinfer kms shard serve`` processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from eth_account import Account
from eth_account.signers.local import LocalAccount

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.enclave.runner import AccountSigner, EnclaveRunner
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.identity import sign_eip191
from verinfer.kms.local_cluster import ClusterLayout, provision
from verinfer.kms.protocol import ReleaseRequest, report_data, requester_digest

M = measurement("sha256:" + "44" * 32, "code", "engine")
EVIL_SCRIPT = Path(__file__).with_name("kms_evil_shard.py")


def make_cluster(root: Path, *, n: int, t: int) -> tuple[ClusterLayout, LocalAccount]:
    member = Account.create()
    lay = provision(root, epoch=1, threshold=t, shares=n, measurements=[M],
                    verifiers=[member.address], challenges={"c1": [member.address]},
                    unsafe_single_tree=True)
    return lay, member


def runner(lay: ClusterLayout, member: LocalAccount) -> EnclaveRunner:
    return EnclaveRunner(attester=SoftwareAttester(load_root_private(lay.root_key), M, time.time),
                         shards=lay.shards_info(), epochs=FileEpochRegistry(lay.registry),
                         signer=AccountSigner(member))


class EvilShard:
    """The malicious shard ``index`` of ``lay`` as a child process."""

    def __init__(self, lay: ClusterLayout, index: int, mode: str, record: Path) -> None:
        info = {s.index: s for s in lay.shards_info()}
        self.url = info[index].url
        self.record = record
        peers = [a for s in info.values() if s.index != index for a in ("--peer", s.url)]
        self.proc = subprocess.Popen(
            [sys.executable, str(EVIL_SCRIPT), "--port", self.url.rsplit(":", 1)[1],
             "--index", str(index), "--mode", mode, "--record", str(record), *peers],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError(f"evil shard {index} did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def signed_request(lay: ClusterLayout, url: str, index: int, signer: LocalAccount, *,
                   challenge_id: str = "c1") -> ReleaseRequest:
    """A well-formed release request for shard ``index`` alone (its nonce, a genuine
    SoftwareEnclave quote, signed by ``signer``): one that passes authentication (checks 1-6),
    so the shard's decision on it is logged."""
    nonce = bytes.fromhex(httpx.post(url + "/v1/nonce", timeout=5).json()["nonce"][2:])
    pub = X25519PrivateKey.generate().public_key().public_bytes_raw()
    who = signer.address.lower()
    rd = report_data(epoch=1, purpose="full_challenge", challenge_id=challenge_id,
                     requester=who, enclave_public_key=pub, nonces={index: nonce})
    att = SoftwareAttester(load_root_private(lay.root_key), M, time.time)
    return ReleaseRequest(epoch=1, purpose="full_challenge", challenge_id=challenge_id,
                          requester=who,
                          requester_signature=sign_eip191(signer, requester_digest(rd)),
                          enclave_public_key=pub, nonces={index: nonce}, quote=att.quote(rd))
