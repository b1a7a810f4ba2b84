"""The verifier's, the devnet's, the explorer's, the auditor's and the vLLM backend's errors are
domain errors (issue 22): they say whose fault it is and nothing about HTTP; the edges choose
the status.

What must not change with the move off the OpenAI API tree: every CLI's exit code (2 for the
caller's fault, 1 for ours, from the marker) and every HTTP answer (the explorer's 404 for an
id it does not hold, the operator's 500 for a vLLM backend fault, its 503 while not ready)."""

from __future__ import annotations

from pathlib import Path

import pytest

from verinfer.auditor.material import AuditInputError
from verinfer.cli_errors import exit_code_for
from verinfer.devnet.harness import DevnetStateError
from verinfer.engine.export_hf import ExportError
from verinfer.engine.vllm_backend.engine import VllmBackendError
from verinfer.errors import (
    ClientError,
    InvalidRequestError,
    KernelError,
    ModelLoadError,
    ModelNotFoundError,
    ServerError,
    TokenizerError,
    VerinferError,
)
from verinfer.explorer import errors as explorer_errors
from verinfer.explorer.errors import NotFoundError
from verinfer.operator import errors as operator_errors
from verinfer.operator.readiness import NotReadyError
from verinfer.protocol.hexutil import HexFormatError
from verinfer.verifier import errors as V


def _make(cls: type[VerinferError]) -> VerinferError:
    if cls is V.OperatorFault:
        return cls("manifest_missing", "boom")
    return cls("boom")


# The exit code each had while it sat on the OpenAI API tree (ClientError -> 2, ServerError -> 1).
@pytest.mark.parametrize(
    ("cls", "exit_code"),
    [
        (V.VerifierError, 1),
        (V.CannotJudgeError, 1),
        (V.LocalFault, 1),
        (V.EvidenceUnavailableError, 1),
        (V.OperatorFault, 2),
        (V.ReceiptRefError, 2),
        (V.AuditJobError, 2),
        (V.ChallengeStateError, 2),
        (DevnetStateError, 2),
        (NotFoundError, 2),
        (VllmBackendError, 1),
        (AuditInputError, 2),
        (ModelLoadError, 2),
        (TokenizerError, 2),
        (ExportError, 2),
        (KernelError, 1),
    ],
)
def test_domain_errors_keep_their_exit_codes_without_an_http_status(
    cls: type[VerinferError], exit_code: int
) -> None:
    assert not issubclass(cls, ClientError | ServerError), cls
    assert not hasattr(_make(cls), "status_code"), cls  # the edges choose it
    assert exit_code_for(_make(cls)) == exit_code


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NotFoundError("no batch 0x01"), 404),
        (HexFormatError("not hex"), 400),  # an id that does not parse
        (InvalidRequestError("bad page number"), 400),
        (ModelNotFoundError("an API error keeps its own status"), 404),
        (V.ReceiptRefError("a caller's fault without a table entry"), 400),
        (V.LocalFault("our fault without a table entry"), 500),
    ],
)
def test_the_explorer_edge_maps_domain_errors(error: VerinferError, status: int) -> None:
    assert explorer_errors.http_status(error) == status


def test_the_operator_edge_answers_a_vllm_fault_500_and_not_ready_503() -> None:
    fault = VllmBackendError("vLLM did not take the rule's token")
    assert operator_errors.http_status(fault) == 500
    assert operator_errors.error_payload(fault)["error"]["type"] == "server_error"
    # NotReadyError stays on the API tree: it is an answer the OpenAI-compatible API itself
    # gives (503 + Retry-After), raised only by the operator's own readiness gate.
    not_ready = NotReadyError("no chain binding", retry_after=3)
    assert operator_errors.http_status(not_ready) == 503


def test_the_explorer_cli_reports_an_unusable_option_with_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from verinfer.explorer.cli import app

    missing = tmp_path / "deployment.json"
    r = CliRunner().invoke(app, ["--deployment", str(missing), "--rpc-url", "http://127.0.0.1:1"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: cannot read deployment file {missing}")


# What the operator's API answered while these sat on the API tree (ClientError 400 /
# ServerError 500), now read from the marker at its edge.
@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (ModelLoadError("corrupt weights"), 400, "invalid_request_error"),
        (TokenizerError("no merges"), 400, "invalid_request_error"),
        (KernelError("kernel library missing"), 500, "server_error"),
    ],
)
def test_the_operator_edge_keeps_the_engine_errors_answers(
    error: VerinferError, status: int, kind: str
) -> None:
    assert operator_errors.http_status(error) == status
    body = operator_errors.error_payload(error)["error"]
    assert body["type"] == kind and body["code"] == error.code
