"""The explorer's errors: an id that parses but names nothing is a 404 (page and API alike);
an id that does not parse is the HexFormatError / InvalidRequestError of the protocol layer
(400)."""

from __future__ import annotations

from verinfer.errors import ClientError


class NotFoundError(ClientError):
    """A well-formed id the index does not hold (yet)."""

    status_code = 404
    code = "not_found"
