"""KMS and attestation errors are domain errors; the shard app alone maps them to HTTP. A
broken file of the shard's own (sealed share, registry, root key) is its failure (500), never
"a 400 client error"; the refusals keep the statuses of the wire protocol (docs/kms.md)."""

from __future__ import annotations

import pytest

from verinfer.attestation.errors import (
    AttestationError,
    MeasurementNotAllowedError,
    QuoteMalformedError,
    RootKeyError,
)
from verinfer.errors import InvalidRequestError, VerinferError
from verinfer.kms import errors as E
from verinfer.kms.shard_app import http_status


@pytest.mark.parametrize(("error", "status"), [
    (E.SealError("cannot unseal: tampered file"), 500),
    (E.RegistryError("malformed epoch record"), 500),
    (E.InvalidShareError("share out of range"), 500),
    (RootKeyError("root.pub malformed"), 500),
    (E.BadReleaseRequest("no nonce"), 400),
    (E.NotPerReceiptEpochError("x25519 epoch"), 400),
    (E.EncapsulationMalformedRefusal("E is the identity"), 400),
    (E.EncapsulationProofRefusal("proof made for another receipt"), 400),
    (E.EncapsulationReusedError("E already decrypted for another envelope"), 403),
    (E.EncapsulationStoreError("released-encapsulations.jsonl unreadable"), 500),
    (E.RequestTooLargeError("body too large"), 413),
    (E.RequesterSignatureError("bad signature"), 401),
    (E.NotCommitteeMemberError("not drawn"), 403),
    (E.ThresholdEpochError("per-receipt epoch"), 403),
    (E.RateLimitedError("slow down"), 429),
    (E.EpochError("unknown epoch"), 404),
    (E.EpochExistsError("epoch 1 exists"), 409),
    (E.EpochRetiredError("retired"), 403),
    (QuoteMalformedError("not a quote"), 400),
    (MeasurementNotAllowedError("foreign image"), 403),
    (AttestationError("expired"), 403),
    (E.NonceCapacityError("full"), 503),
    (E.ShareUnavailableError("share missing"), 503),
    (E.CommitteeUnavailableError("rpc down"), 503),
    (InvalidRequestError("an API error keeps its own status"), 400),
])
def test_the_shard_edge_maps_domain_errors(error: VerinferError, status: int) -> None:
    assert http_status(error) == status


def test_kms_and_attestation_errors_are_not_http_client_errors() -> None:
    from verinfer.errors import ClientError, ServerError

    for cls in (E.KmsError, AttestationError, RootKeyError):
        assert not issubclass(cls, ClientError | ServerError), cls
