"""Data availability: one DAClient interface (local, redis, eigenda-proxy backends), batch
manifests with Merkle inclusion proofs, and the durable publication outbox."""

from verinfer.da_client.base import DAClient
from verinfer.da_client.errors import (
    BlobNotFoundError,
    BlobTooLargeError,
    CommitmentMismatchError,
    DAUnavailableError,
    MalformedPointerError,
    ManifestError,
)
from verinfer.da_client.manifest import (
    BatchManifest,
    ManifestEntry,
    build_manifest,
    inclusion_proof,
    parse_manifest,
)
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.sinks import BatchCommitment, BatchSink

__all__ = [
    "BatchCommitment",
    "BatchManifest",
    "BatchSink",
    "BlobNotFoundError",
    "BlobTooLargeError",
    "CommitmentMismatchError",
    "DAClient",
    "DAUnavailableError",
    "MalformedPointerError",
    "ManifestEntry",
    "ManifestError",
    "Pointer",
    "build_manifest",
    "inclusion_proof",
    "parse_manifest",
]
