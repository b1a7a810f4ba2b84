"""Epoch key generation: draw s, split it t-of-n, seal each share for its shard, register the
public part. The whole secret never touches the disk: only sealed shares are written, each under
its own shard's seal key (which must live apart from the share files)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from pathlib import Path

from verinfer.kms import tdh
from verinfer.kms.app_keys import DEFAULT_SUITE, app_keypair, parse_suite, seed_from_secret
from verinfer.kms.epochs import EpochRecord, EpochRegistry
from verinfer.kms.errors import EpochError, EpochExistsError, InvalidShareError
from verinfer.kms.sealing import TokenBytes, write_sealed
from verinfer.kms.shamir import RandBelow, Share, check_params, random_scalar, split
from verinfer.kms.tdh import ScalarShare
from verinfer.protocol.hexutil import to_hex
from verinfer.receipts.epoch_keys import EnvelopeSuite


def share_label(epoch: int, index: int) -> str:
    return f"verinfer/kms/share/v1:epoch={epoch}:index={index}"


def share_path(shard_dir: Path, epoch: int) -> Path:
    return shard_dir / f"epoch-{epoch}.share.sealed"


def shard_dir(out: Path, index: int) -> Path:
    return out / f"shard-{index}"


def keygen(*, epoch: int, threshold: int, shares: int, out: Path,
           seal_keys: Mapping[int, bytes], registry: EpochRegistry,
           suite: str = DEFAULT_SUITE, now: Callable[[], float],
           rng: RandBelow = secrets.randbelow,
           token_bytes: TokenBytes = secrets.token_bytes) -> EpochRecord:
    """Create epoch ``epoch``. Writes ``out/shard-<i>/epoch-<epoch>.share.sealed`` for i=1..n and
    registers the record (status live). Nothing is written if the epoch already exists."""
    check_params(threshold, shares)
    if epoch < 0:
        raise InvalidShareError(f"epoch must be >= 0, got {epoch}")
    missing = [i for i in range(1, shares + 1) if i not in seal_keys]
    if missing:
        raise InvalidShareError(f"no seal key for shards {missing}")
    try:
        registry.get(epoch)
    except EpochError:  # unknown epoch: the normal case
        pass
    else:
        raise EpochExistsError(f"epoch {epoch} already registered")

    share_list: list[Share] | list[ScalarShare]
    if EnvelopeSuite.parse(parse_suite(suite)).threshold_decapsulable:
        # P-256 threshold suite: the dealer (tdh.deal) draws s over the P-256 order and hands
        # back only shares and commitments; C_0 is the HPKE public key.
        public_raw, share_list, commitments = tdh.deal(threshold, shares, rng)
    else:
        secret = random_scalar(rng)
        seed = seed_from_secret(secret)
        try:
            _, public = app_keypair(seed, suite)
            share_list, commitments = split(secret, threshold, shares, rng)
        finally:
            seed[:] = bytes(len(seed))
            secret = 0
        public_raw = public.to_bytes()
    for sh in share_list:
        buf = bytearray(sh.value.to_bytes(32, "big"))
        try:
            write_sealed(share_path(shard_dir(out, sh.index), epoch), seal_keys[sh.index], buf,
                         share_label(epoch, sh.index), token_bytes)
        finally:
            buf[:] = bytes(32)
    record = EpochRecord(epoch=epoch, threshold=threshold, shares=shares, suite=suite,
                         public_key=to_hex(public_raw),
                         commitments=tuple(to_hex(c) for c in commitments),
                         status="live", created_at=int(now()))
    registry.register(record)
    return record
