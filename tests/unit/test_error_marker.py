"""The "whose fault" marker of verinfer.errors and the one map to HTTP at the operator's edge.

Domain errors (DA, receipts, chain) carry no HTTP status of their own; the operator API must
still answer each with the status it always had (clients and the OpenAI error shape tests
depend on it), and a CLI must still exit 2 for the caller's fault, 1 for ours."""

from __future__ import annotations

import pytest
import typer

from verinfer import cli_errors
from verinfer.chain import errors as chain_errors
from verinfer.da_client import errors as da
from verinfer.errors import (
    BadInputError,
    ClientError,
    EngineOverloadedError,
    InvalidRequestError,
    ModelNotFoundError,
    ServerError,
    VerinferError,
)
from verinfer.operator.errors import http_status
from verinfer.protocol import errors as protocol_errors
from verinfer.receipts import errors as receipts_errors

DOMAIN_MODULES = (da, chain_errors, protocol_errors, receipts_errors)


def _domain_classes() -> list[type[VerinferError]]:
    return [v for m in DOMAIN_MODULES for v in vars(m).values()
            if isinstance(v, type) and issubclass(v, VerinferError)
            and v.__module__.startswith(("verinfer.da_client", "verinfer.chain",
                                         "verinfer.receipts", "verinfer.protocol"))]


def test_domain_errors_are_not_http_api_errors() -> None:
    classes = _domain_classes()
    assert len(classes) >= 20
    for cls in classes:
        assert not issubclass(cls, ClientError | ServerError), cls
        assert "status_code" not in vars(cls), cls  # no status of their own


def test_the_api_tree_is_the_caller_fault_where_it_is_4xx() -> None:
    assert InvalidRequestError("x").caller_fault and issubclass(ClientError, BadInputError)
    assert not EngineOverloadedError("x").caller_fault


def _make(cls: type[VerinferError]) -> VerinferError:
    if cls is receipts_errors.EnvelopeDecryptionError:
        return cls()
    if cls is chain_errors.ContractRevertError:
        return cls("reverted", error_name="X", error_args=(), data=b"")
    return cls("boom")


# What the operator's API answered before the domain errors lost their HTTP bases.
@pytest.mark.parametrize(("cls", "status"), [
    (da.MalformedPointerError, 400), (da.BlobTooLargeError, 413), (da.BlobNotFoundError, 404),
    (da.BackendMismatchError, 400), (da.ManifestError, 400), (da.CommitmentMismatchError, 502),
    (da.DAUnavailableError, 503), (da.OutboxError, 500), (da.OutboxConflictError, 409),
    (da.PublisherBusyError, 500), (da.DAProtocolError, 502),
    (protocol_errors.ReceiptFormatError, 400), (protocol_errors.UnsupportedVersionError, 400),
    (receipts_errors.SignatureError, 400), (receipts_errors.WrongChainError, 400),
    (receipts_errors.MerkleError, 400), (receipts_errors.EnvelopeDecryptionError, 400),
    (receipts_errors.EnvelopeContentError, 400), (receipts_errors.IssuedAtSkewError, 400),
    (chain_errors.ChainError, 500), (chain_errors.AnvilError, 500),
    (chain_errors.ArtifactsMissingError, 500), (chain_errors.ContractRevertError, 409),
    (chain_errors.KeyLoadError, 400), (chain_errors.DeploymentFileError, 400),
    (chain_errors.StakeActionError, 400),
    (ModelNotFoundError, 404), (EngineOverloadedError, 503), (InvalidRequestError, 400),
])
def test_the_operator_edge_keeps_every_status(cls: type[VerinferError], status: int) -> None:
    e = _make(cls)
    assert http_status(e) == status
    assert e.caller_fault is (status < 500 and cls is not da.OutboxConflictError)
    assert e.error_type == ("invalid_request_error" if e.caller_fault else "server_error")


@pytest.mark.parametrize(("problem", "exit_code", "shown"), [
    (da.ManifestError("bad manifest"), 2, "error: bad manifest"),
    (da.DAUnavailableError("proxy down"), 1, "error: proxy down"),
    (OSError("disk gone"), 1, "error: disk gone"),
    ("no outbox at /x", 2, "error: no outbox at /x"),
])
def test_fail_picks_the_exit_code_from_the_marker(
        problem: BaseException | str, exit_code: int, shown: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    ex = cli_errors.fail(problem)
    assert isinstance(ex, typer.Exit) and ex.exit_code == exit_code
    assert capsys.readouterr().err == shown + "\n"


def test_fail_keeps_an_explicit_exit_code_and_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    ex = cli_errors.fail(chain_errors.ChainError("rpc down"), exit_code=2, prefix="invalid")
    assert ex.exit_code == 2
    assert capsys.readouterr().err == "invalid: rpc down\n"
