from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from verinfer.kms import tdh
from verinfer.kms.app_keys import SUITES
from verinfer.kms.epochs import FileEpochRegistry, require_live
from verinfer.kms.errors import (
    EpochError,
    EpochExistsError,
    EpochRetiredError,
    InvalidShareError,
    RegistryError,
    SealError,
)
from verinfer.kms.keygen import keygen, shard_dir, share_label, share_path
from verinfer.kms.sealing import load_seal_key, new_seal_key, read_sealed, seal, unseal
from verinfer.kms.shamir import Share, reconstruct, verify_share
from verinfer.receipts.epoch_keys import EnvelopeSuite


class Recorder:
    """Wraps secrets.randbelow and remembers the first draw (the epoch secret)."""

    def __init__(self) -> None:
        self.draws: list[int] = []

    def __call__(self, k: int) -> int:
        v = secrets.randbelow(k)
        self.draws.append(v)
        return v


def _keys(tmp: Path, n: int) -> dict[int, bytes]:
    return {i: new_seal_key(tmp / "seal" / f"shard-{i}.key") for i in range(1, n + 1)}


LEGACY = [s for s in SUITES if s != EnvelopeSuite.P256.value]


@pytest.mark.parametrize("suite", LEGACY)
def test_keygen_seals_shares_and_never_writes_the_secret(tmp_path: Path, suite: str) -> None:
    keys = _keys(tmp_path, 5)
    reg = FileEpochRegistry(tmp_path / "epochs.json")
    rng = Recorder()
    rec = keygen(epoch=7, threshold=3, shares=5, out=tmp_path / "out", seal_keys=keys,
                 registry=reg, suite=suite, now=lambda: 1000.0, rng=rng)
    secret = 1 + rng.draws[0]
    assert rec.status == "live" and rec.created_at == 1000 and reg.get(7) == rec
    assert len(rec.commitments) == 3
    shares = []
    for i in range(1, 6):
        buf = read_sealed(share_path(shard_dir(tmp_path / "out", i), 7), keys[i],
                          share_label(7, i))
        sh = Share(i, int.from_bytes(buf, "big"))
        verify_share(sh, rec.commitment_bytes)
        shares.append(sh)
    assert reconstruct(shares[2:], 3) == secret
    # no file anywhere holds the secret, in binary or hex
    needle, needle_hex = secret.to_bytes(32, "big"), secret.to_bytes(32, "big").hex()
    for f in tmp_path.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert needle not in data and needle_hex.encode() not in data, f


def test_p256_keygen_shares_lie_on_the_commitments_and_s_is_written_nowhere(
        tmp_path: Path) -> None:
    keys = _keys(tmp_path, 5)
    reg = FileEpochRegistry(tmp_path / "epochs.json")
    rng = Recorder()
    rec = keygen(epoch=7, threshold=3, shares=5, out=tmp_path / "out", seal_keys=keys,
                 registry=reg, suite=EnvelopeSuite.P256.value, now=lambda: 1000.0, rng=rng)
    secret = 1 + rng.draws[0]  # tdh.deal's first draw is a_0 = s
    cpts = tdh.parse_commitments(rec.commitment_bytes, 3)
    assert rec.public_key_bytes == tdh.encode(tdh.base_mult(secret), compressed=False)
    assert tdh.encode(cpts[0]) == tdh.encode(tdh.base_mult(secret))
    for i in range(1, 6):
        buf = read_sealed(share_path(shard_dir(tmp_path / "out", i), 7), keys[i],
                          share_label(7, i))
        tdh.check_share(tdh.ScalarShare(i, int.from_bytes(buf, "big")), cpts)
    needle = secret.to_bytes(32, "big")
    for f in tmp_path.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert needle not in data and needle.hex().encode() not in data, f


def test_no_code_path_rebuilds_a_threshold_epoch_secret() -> None:
    """The only scalar interpolation in src/ is shamir.reconstruct, called only by the enclave
    runner's legacy path (_rebuild), which refuses threshold epochs before asking any shard;
    kms/tdh.py interpolates points only. A new caller anywhere fails this test."""
    import re

    src = Path(__file__).parents[2] / "src" / "verinfer"
    callers = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                     if re.search(r"\breconstruct\(", p.read_text())
                     and p.name != "shamir.py")
    assert callers == ["enclave/runner.py"]
    runner = (src / "enclave" / "runner.py").read_text()
    assert len(re.findall(r"\breconstruct\(", runner)) == 1
    assert "threshold_decapsulable" in runner.split("async def obtain_key_async")[1][:600]
    tdh_src = (src / "kms" / "tdh.py").read_text()
    assert "reconstruct" not in tdh_src and "pow(den, -1, N)" in tdh_src  # λ_i for points


def test_keygen_refuses_duplicates_and_bad_input(tmp_path: Path) -> None:
    keys = _keys(tmp_path, 3)
    reg = FileEpochRegistry(tmp_path / "epochs.json")
    keygen(epoch=1, threshold=2, shares=3, out=tmp_path, seal_keys=keys, registry=reg,
           now=lambda: 0)
    with pytest.raises(EpochExistsError):
        keygen(epoch=1, threshold=2, shares=3, out=tmp_path, seal_keys=keys, registry=reg,
               now=lambda: 0)
    with pytest.raises(InvalidShareError):
        keygen(epoch=2, threshold=4, shares=3, out=tmp_path, seal_keys=keys, registry=reg,
               now=lambda: 0)
    with pytest.raises(InvalidShareError, match=r"no seal key for shards \[4\]"):
        keygen(epoch=2, threshold=2, shares=4, out=tmp_path, seal_keys=keys, registry=reg,
               now=lambda: 0)
    with pytest.raises(InvalidShareError, match="unknown HPKE suite"):
        keygen(epoch=2, threshold=2, shares=3, out=tmp_path, seal_keys=keys, registry=reg,
               now=lambda: 0, suite="rot13")
    assert [r.epoch for r in reg.all()] == [1]


def test_retire_and_rotation(tmp_path: Path) -> None:
    keys = _keys(tmp_path, 3)
    reg = FileEpochRegistry(tmp_path / "epochs.json")
    r1 = keygen(epoch=1, threshold=2, shares=3, out=tmp_path, seal_keys=keys, registry=reg,
                now=lambda: 0)
    r2 = keygen(epoch=2, threshold=2, shares=3, out=tmp_path, seal_keys=keys, registry=reg,
                now=lambda: 5)
    assert r1.public_key != r2.public_key
    assert reg.retire(1, 9).retired_at == 9
    with pytest.raises(EpochRetiredError):
        require_live(reg, 1)
    assert require_live(reg, 2) == r2
    with pytest.raises(EpochError):
        reg.get(3)
    (tmp_path / "epochs.json").write_text('{"version": 1, "epochs": [{"epoch": 1}]}')
    with pytest.raises(RegistryError):
        reg.get(1)


def test_sealing_binds_key_and_label(tmp_path: Path) -> None:
    k1, k2 = bytes(range(32)), bytes(32)
    blob = seal(k1, b"share bytes", "label-a")
    assert unseal(k1, blob, "label-a") == bytearray(b"share bytes")
    with pytest.raises(SealError):
        unseal(k2, blob, "label-a")
    with pytest.raises(SealError):
        unseal(k1, blob, "label-b")
    with pytest.raises(SealError):
        unseal(k1, blob[:-1] + bytes([blob[-1] ^ 1]), "label-a")
    with pytest.raises(SealError):
        seal(b"short", b"x", "l")
    kf = tmp_path / "k.key"
    key = new_seal_key(kf)
    assert load_seal_key(kf) == key and (kf.stat().st_mode & 0o777) == 0o600
    with pytest.raises(SealError):
        new_seal_key(kf)
    with pytest.raises(SealError):
        load_seal_key(None, "VERINFER_TEST_UNSET_SEAL_KEY")


def test_seal_key_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERINFER_TEST_SEAL", "ab" * 32)
    assert load_seal_key(None, "VERINFER_TEST_SEAL") == bytes([0xAB]) * 32
    monkeypatch.setenv("VERINFER_TEST_SEAL", "zz")
    with pytest.raises(SealError, match="not hex"):
        load_seal_key(None, "VERINFER_TEST_SEAL")
