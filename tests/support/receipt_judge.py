"""The real verifier job on a real server's receipt (tests): the epoch key from the dev KMS of
an `operator init --unsafe-dev` directory, the sealed blob from its local DA, and
`verify_receipt_job`'s verdict."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from verinfer.da_client.errors import BlobNotFoundError
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.pointer import Pointer
from verinfer.kms.app_keys import app_keypair, seed_from_secret
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.keygen import shard_dir, share_label, share_path
from verinfer.kms.local_cluster import ClusterLayout
from verinfer.kms.sealing import load_seal_key, read_sealed
from verinfer.kms.shamir import Share, reconstruct
from verinfer.receipts.epoch_keys import EpochPrivateKey
from verinfer.verifier.reexec import verify_receipt_job


def epoch_private_key(operator_dir: Path) -> EpochPrivateKey:
    """Epoch 1's private key from two of the dev KMS's three sealed shares (as t shards release
    it into a verifier's enclave)."""
    lay = ClusterLayout(operator_dir / "kms", 3)
    rec = FileEpochRegistry(lay.registry).get(1)
    shares = [Share(i, int.from_bytes(read_sealed(share_path(shard_dir(lay.root, i), 1),
                                                  load_seal_key(lay.seal_key_file(i)),
                                                  share_label(1, i)), "big"))
              for i in (1, 2)]
    sk, _ = app_keypair(seed_from_secret(reconstruct(shares, rec.threshold)), rec.suite)
    return sk


def verification(response: Any) -> dict[str, Any]:
    """The ``verification`` object an SDK response carries (``model_extra``)."""
    out: dict[str, Any] = (response.model_extra or {})["verification"]
    return out


def judge(v: dict[str, Any], operator_dir: Path, model: Path, sk: EpochPrivateKey
          ) -> dict[str, Any]:
    """The verifier job's verdict on the receipt of ``v`` (waits for the blob: the publisher
    uploads off the response path)."""
    da = LocalDAClient(str(operator_dir / "da"))
    deadline = time.monotonic() + 60
    while True:
        try:
            blob = da.get(Pointer.parse(v["da_pointer"]))
            break
        except BlobNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    out: dict[str, Any] = verify_receipt_job(sk, receipt=v["receipt"]["message"], blob=blob,
                                             model_path=str(model))
    return out


def assert_reproduced(v: dict[str, Any], operator_dir: Path, model: Path,
                      sk: EpochPrivateKey) -> None:
    out = judge(v, operator_dir, model, sk)
    assert out["reason"] == "match" and out["agrees"] is True, out
    assert out["vote"] == v["out_hash"]
