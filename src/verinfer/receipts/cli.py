"""`verinfer receipts`: shared test vectors, receipt verification, EIP-712 JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from verinfer.cli_errors import fail
from verinfer.errors import VerinferError
from verinfer.protocol.hexutil import to_hex

app = typer.Typer(help="Receipts: vectors, verification, EIP-712 typed data.",
                  no_args_is_help=True)


@app.command()
def vectors(out: Annotated[Path | None, typer.Option(help="directory (default tests/vectors)")]
            = None,
            check: Annotated[bool, typer.Option(help="fail if the files are stale")] = False
            ) -> None:
    """Write (or --check) tests/vectors/receipts.json and merkle.json."""
    from verinfer.receipts.vectors import DEFAULT_OUT, main

    args = ["--out", str(out or DEFAULT_OUT)] + (["--check"] if check else [])
    raise typer.Exit(main(args))


def _load(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise fail(f"cannot read {path}: {e}", exit_code=2, prefix=None) from None


@app.command()
def verify(path: Annotated[Path, typer.Argument(help="signed receipt JSON "
                                                     "{receipt, domain, signature}")],
           operator: Annotated[str | None, typer.Option(help="expected operator address")]
           = None) -> None:
    """Check a signed receipt; prints its digest and signer, exit 1 if invalid."""
    from verinfer.receipts.signed import SignedReceipt

    try:
        signed = SignedReceipt.from_json(_load(path))  # type: ignore[arg-type]
        signer = signed.verify(operator)
    except VerinferError as e:
        raise fail(e, exit_code=1, prefix="invalid") from None
    typer.echo(json.dumps({"valid": True, "signer": signer,
                           "digest": to_hex(signed.digest)}))


@app.command("typed-data")
def typed_data(path: Annotated[Path, typer.Argument(help="signed receipt JSON")]) -> None:
    """Print the complete EIP-712 JSON (eth_signTypedData_v4 shape) of a receipt."""
    from verinfer.receipts.signed import SignedReceipt

    try:
        signed = SignedReceipt.from_json(_load(path))  # type: ignore[arg-type]
    except VerinferError as e:
        raise fail(e, exit_code=1, prefix="invalid") from None
    typer.echo(json.dumps(signed.receipt.as_typed_data(signed.domain), indent=2))
