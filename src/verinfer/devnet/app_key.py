"""The devnet's app key, for an auditor practising on it (docs/cookbook.md §1).

The app key is the key epoch's secret: it opens every envelope of the epoch. In a real
deployment no one holds it whole — its shares sit with different KMS shards and t of them never
meet. The devnet keeps every sealed share and every seal key in one tree
(``provision(..., unsafe_single_tree=True)``), so it can be rebuilt here from t shares and
handed to `verinfer reproduce --app-key` as the app owner would hand theirs."""

from __future__ import annotations

from pathlib import Path

from verinfer.auditor.material import write_app_key
from verinfer.kms.epochs import FileEpochRegistry
from verinfer.kms.keygen import shard_dir, share_label, share_path
from verinfer.kms.local_cluster import ClusterLayout
from verinfer.kms.sealing import load_seal_key, read_sealed
from verinfer.kms.tdh import N, lagrange_at_zero


def unsafe_devnet_app_key(kms_root: Path, out: Path, epoch: int = 1) -> Path:
    """Rebuilds epoch ``epoch``'s secret from t sealed shares of the devnet's single-tree KMS
    and writes it as an auditor's app key file (0600)."""
    rec = FileEpochRegistry(kms_root / "epochs.json").get(epoch)
    lay = ClusterLayout(kms_root, rec.shares)
    use = list(range(1, rec.threshold + 1))
    lam = lagrange_at_zero(use)
    secret = 0
    for i in use:
        share = read_sealed(share_path(shard_dir(kms_root, i), epoch),
                            load_seal_key(lay.seal_key_file(i)), share_label(epoch, i))
        secret = (secret + lam[i] * int.from_bytes(share, "big")) % N
    write_app_key(out, rec.suite, secret.to_bytes(32, "big"), epoch)
    return out
