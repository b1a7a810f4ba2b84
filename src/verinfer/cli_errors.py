"""How every ``verinfer`` command reports a failure: one line on stderr, one exit code.

Exit 2: the caller's fault (bad arguments, a malformed file or receipt handed in); exit 1:
ours (a node down, a backend failing, a bug). The exit code follows the error's
``caller_fault`` marker (:mod:`verinfer.errors`; read as an attribute, so this module and
the exception tree, both in layer 0, do not import each other) unless a command pins its own.
"""

from __future__ import annotations

import typer

CALLER_FAULT_EXIT = 2
OWN_FAULT_EXIT = 1


def exit_code_for(problem: BaseException | str) -> int:
    """2 when the caller is at fault, else 1. A message a command writes itself is about its
    arguments (the caller's); an exception outside verinfer's tree is unexpected (ours)."""
    if isinstance(problem, str):
        return CALLER_FAULT_EXIT
    if getattr(problem, "caller_fault", False) is True:
        return CALLER_FAULT_EXIT
    return OWN_FAULT_EXIT


def fail(problem: BaseException | str, *, exit_code: int | None = None,
         prefix: str | None = "error") -> typer.Exit:
    """Print ``problem`` on stderr as ``<prefix>: <message>`` and return the ``typer.Exit`` to
    raise (``raise fail(e) from e``). ``exit_code`` pins the code where a command documents
    its own; ``prefix=None`` prints the message alone."""
    message = problem if isinstance(problem, str) else str(getattr(problem, "message", problem))
    typer.echo(message if prefix is None else f"{prefix}: {message}", err=True)
    return typer.Exit(exit_code_for(problem) if exit_code is None else exit_code)
