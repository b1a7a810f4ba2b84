"""The explorer's errors and the one map from verinfer's errors to the explorer's HTTP answers.

An id that parses but names nothing is a :class:`NotFoundError` (a domain error: the caller
asked for something absent), answered 404, page and API alike; an id that does not parse is the
HexFormatError / InvalidRequestError of the protocol layer (400). The status is chosen here, at
the edge, as the operator API (``verinfer.operator.errors``) and the KMS shard app do for theirs.
"""

from __future__ import annotations

from verinfer.errors import BadInputError, ClientError, ServerError, VerinferError


class NotFoundError(BadInputError):
    """A well-formed id the index does not hold (yet)."""

    code = "not_found"


#: Domain error -> HTTP status where it is not the marker's generic 400 / 500.
HTTP_STATUS: tuple[tuple[type[VerinferError], int], ...] = ((NotFoundError, 404),)


def http_status(e: VerinferError) -> int:
    """The HTTP status the explorer (pages and ``/api/``) answers ``e`` with."""
    for kind, status in HTTP_STATUS:
        if isinstance(e, kind):
            return status
    if isinstance(e, ClientError | ServerError):  # the OpenAI API tree carries its own status
        return e.status_code
    return 400 if e.caller_fault else 500
