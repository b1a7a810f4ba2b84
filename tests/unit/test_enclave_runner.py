"""EnclaveRunner against real shard apps in this process (ASGI, no sockets): threshold
reconstruction, corrupt shares named before reconstruction, wiping, and the job contract."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import httpx
import pytest
from eth_account import Account

from verinfer.attestation.quotes import measurement
from verinfer.attestation.software import SoftwareAttester, load_root_private
from verinfer.enclave.errors import JobError, KeyReleaseError
from verinfer.enclave.jobs import open_blob
from verinfer.enclave.runner import AccountSigner, EnclaveRunner
from verinfer.kms.app_keys import app_keypair
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.keygen import share_label, share_path
from verinfer.kms.local_cluster import ClusterLayout, build_shard_service, provision
from verinfer.kms.sealing import load_seal_key, write_sealed
from verinfer.kms.shard_app import create_app
from verinfer.receipts.epoch_keys import load_public_key

M = measurement("sha256:" + "22" * 32, "code", "engine")


class Routes(httpx.AsyncBaseTransport):
    """Sends each request to the shard app listening (in this process) on its URL's port;
    ports in ``down`` refuse the connection like a stopped server."""

    def __init__(self, apps: dict[int, httpx.ASGITransport]) -> None:
        self.apps = apps
        self.down: set[int] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        port = request.url.port
        if port in self.down or port not in self.apps:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.apps[port].handle_async_request(request)


def _cluster(tmp: Path, n: int = 5, t: int = 3
             ) -> tuple[ClusterLayout, Routes, EnclaveRunner, dict[int, int]]:
    member = Account.create()
    lay = provision(tmp / "kms", epoch=1, threshold=t, shares=n, measurements=[M],
                    verifiers=[member.address], challenges={"c1": [member.address]},
                    unsafe_single_tree=True)
    infos = lay.shards_info()
    port = {s.index: int(s.url.rsplit(":", 1)[1]) for s in infos}
    apps = {port[i]: httpx.ASGITransport(app=create_app(
        build_shard_service(lay, i, now=time.time))) for i in port}
    routes = Routes(apps)
    runner = EnclaveRunner(
        attester=SoftwareAttester(load_root_private(lay.root_key), M, time.time),
        shards=infos, epochs=FileEpochRegistry(lay.registry), signer=AccountSigner(member),
        transport=routes)
    return lay, routes, runner, port


def _corrupt(lay: ClusterLayout, index: int) -> None:
    write_sealed(share_path(lay.data_dir(index), 1), load_seal_key(lay.seal_key_file(index)),
                 secrets.token_bytes(32), share_label(1, index))


def test_key_rebuilt_and_wiped(tmp_path: Path) -> None:
    lay, _, runner, _ = _cluster(tmp_path)
    rec = FileEpochRegistry(lay.registry).get(1)
    key = runner.obtain_key(epoch=1, purpose="full_challenge", challenge_id="c1")
    assert key.private_key is not None
    assert key.private_key.public_key().to_bytes() == rec.public_key_bytes
    assert key.shards_used == [1, 2, 3] and key.corrupt_shards == []
    buffers = list(key._buffers)
    assert len(buffers) == 4 and all(any(b) for b in buffers)  # 3 shares + the seed
    key.close()
    assert key.private_key is None and all(not any(b) for b in buffers)


def test_down_shards_are_skipped(tmp_path: Path) -> None:
    _, routes, runner, port = _cluster(tmp_path)
    routes.down = {port[1], port[4]}
    key = runner.obtain_key(epoch=1, purpose="full_challenge", challenge_id="c1")
    assert key.shards_used == [2, 3, 5]
    assert set(key.refusals) == {1, 4} and key.refusals[1].startswith("unreachable")
    key.close()
    routes.down = {port[1], port[4], port[5]}
    with pytest.raises(KeyReleaseError, match="only 2 of 5 shards") as ei:
        runner.obtain_key(epoch=1, purpose="full_challenge", challenge_id="c1")
    assert set(ei.value.refusals) == {1, 4, 5}


def test_corrupt_share_is_named_and_replaced(tmp_path: Path) -> None:
    lay, routes, runner, port = _cluster(tmp_path)
    _corrupt(lay, 2)
    key = runner.obtain_key(epoch=1, purpose="full_challenge", challenge_id="c1")
    assert key.corrupt_shards == [2]
    assert "share_verification_failed" in key.refusals[2] and "shard 2" in key.refusals[2]
    assert key.shards_used == [1, 3, 4]
    key.close()
    # with only t shards up and one of them corrupt, nothing is reconstructed
    routes.down = {port[4], port[5]}
    with pytest.raises(KeyReleaseError) as ei:
        runner.obtain_key(epoch=1, purpose="full_challenge", challenge_id="c1")
    assert ei.value.corrupt_shards == [2]
    assert "corrupt: [2]" in ei.value.message


def test_refusals_are_reported_per_shard(tmp_path: Path) -> None:
    lay, _, runner, _ = _cluster(tmp_path)
    with pytest.raises(KeyReleaseError) as ei:
        runner.obtain_key(epoch=1, purpose="full_challenge", challenge_id="not-open")
    assert set(ei.value.refusals.values()) == {"not_committee_member"}
    assert len(ei.value.refusals) == 5  # asked every shard that issued a nonce, then gave up
    FileEpochRegistry(lay.registry).retire(1, int(time.time()))
    with pytest.raises(KeyReleaseError) as ei:
        runner.obtain_key(epoch=1, purpose="full_challenge", challenge_id="c1")
    assert set(ei.value.refusals.values()) == {"epoch_retired"}


def test_job_receives_the_key_and_opens_a_blob(tmp_path: Path) -> None:
    lay, _, runner, _ = _cluster(tmp_path, n=3, t=2)
    rec = FileEpochRegistry(lay.registry).get(1)
    _, public = app_keypair(secrets.token_bytes(32), rec.suite)  # an unrelated key pair
    pk = load_public_key(rec.suite, rec.public_key_bytes)
    blob = pk.suite.hpke.encrypt(b"secret prompt", pk.hpke, info=b"ctx")
    out = runner.run(lambda k: open_blob(k, blob, b"ctx"), epoch=1, purpose="full_challenge",
                     challenge_id="c1")
    assert out.result == b"secret prompt" and out.key_ms > 0
    wrong = public.suite.hpke.encrypt(b"x", public.hpke, info=b"")
    with pytest.raises(JobError):
        runner.run(lambda k: open_blob(k, wrong), epoch=1, purpose="full_challenge",
                   challenge_id="c1")
