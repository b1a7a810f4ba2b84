"""A cheating operator overwrites its own DA blob with junk (fixed: counts as absent).

The operator runs its Redis DA store (docs/da.md: "An operator must run it with ..."), so it
can ``SET`` any bytes under the content key of a receipt's ciphertext once the receipt is
challenged. Every verifier's ``get`` then raises ``CommitmentMismatchError`` (the bytes do not
hash to the pointer), which ``verifier/enclave_judge.fetch_blob`` (and
``chain_view.challenge_manifest`` for a manifest) classified as the verifier's own DA trouble
(``EvidenceUnavailableError``, a LocalFault retried until the commit window closes): no member
votes, the challenge ended inconclusive and the cheat keeps its stake — against the verifier's
own rule "a member never abstains because of something the operator controls"
(docs/verifier.md). Nothing is gained by a DA man-in-the-middle that it could not already get
by answering "not found", so a mismatch on an operator-hosted, content-addressed backend
(local, redis:
``da_client.pointer.OPERATOR_HOSTED``) counts as absent — ``ciphertext_unavailable`` /
``manifest_unavailable`` once the publication window has passed (``fetch_blob``,
``chain_view.challenge_manifest``). An EigenDA mismatch stays the reader's own trouble.
"""

from __future__ import annotations

import hashlib
import uuid

import pytest

from verinfer.da_client.errors import CommitmentMismatchError
from verinfer.da_client.factory import DARouter
from verinfer.da_client.pointer import Pointer
from verinfer.da_client.redis_backend import RedisDAClient
from verinfer.verifier.chain_view import BatchRecord, ChainView
from verinfer.verifier.enclave_judge import fetch_blob
from verinfer.verifier.errors import EvidenceUnavailableError, LocalFault, OperatorFault


def test_junk_under_the_operators_own_key_counts_as_absent() -> None:
    redis = pytest.importorskip("redis")
    r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        r.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    client = RedisDAClient(prefix=f"vi-test-overwrite-{uuid.uuid4().hex}:", retention_s=60)
    blob = b"VIE\x01" + hashlib.sha256(b"ciphertext").digest()
    pointer = client.put(blob)
    try:
        r.set(client.key(pointer), b"junk the operator wrote after the challenge", ex=60)
        # absent (None) is what the verifier votes on once the window has passed
        assert fetch_blob(DARouter([client]), str(pointer)) is None
    finally:
        r.delete(client.key(pointer))
        client.close()
        r.close()


class _Mismatching:
    """A DA source whose every answer is bytes that do not hash to the pointer."""

    def get(self, pointer: Pointer) -> bytes:
        raise CommitmentMismatchError(f"bytes under {pointer} do not match")


def _pointer(backend: str) -> Pointer:
    commitment = hashlib.sha256(b"blob").digest()
    return Pointer(backend, commitment + (b"cert" if backend == "eigenda" else b""))


def _chain_view() -> ChainView:
    view = ChainView.__new__(ChainView)  # challenge_manifest reads only its manifest cache here
    view._manifests = {}
    return view


def _batch(pointer: Pointer) -> BatchRecord:
    return BatchRecord(batch_id=b"\x01" * 32, operator="0x" + "11" * 20, root=b"\x02" * 32,
                       leaf_count=1, manifest_pointer=str(pointer), block_number=1)


@pytest.mark.parametrize("backend", ["local", "redis"])
def test_rewritten_manifest_on_the_operators_store_is_absent(backend: str) -> None:
    batch = _batch(_pointer(backend))
    with pytest.raises(OperatorFault) as e:
        _chain_view().challenge_manifest(_Mismatching(), batch, absent_is_fault=True)
    assert e.value.reason == "manifest_unavailable"
    with pytest.raises(LocalFault):  # inside the publication window: absent is not yet a fault
        _chain_view().challenge_manifest(_Mismatching(), batch, absent_is_fault=False)


def test_eigenda_mismatch_stays_the_readers_trouble() -> None:
    # the bytes come through the reader's own proxy from the DA network: never the operator's
    # doing, so no vote on them (retry) for the ciphertext and for the manifest
    pointer = _pointer("eigenda")
    with pytest.raises(EvidenceUnavailableError):
        fetch_blob(_Mismatching(), str(pointer))
    with pytest.raises(LocalFault):
        _chain_view().challenge_manifest(_Mismatching(), _batch(pointer), absent_is_fault=True)
