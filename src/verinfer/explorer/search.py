"""The search box: which page a query names. Every id form is parsed strictly first
(``ids``): a malformed query is a 400, a well-formed one nothing matches a 404."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from verinfer.da_client.errors import MalformedPointerError
from verinfer.da_client.pointer import Pointer
from verinfer.errors import InvalidRequestError
from verinfer.explorer.errors import NotFoundError
from verinfer.explorer.ids import parse_address, parse_id32, parse_int_id
from verinfer.explorer.index import Index
from verinfer.explorer.lists import find_models
from verinfer.explorer.models import MAX_NAME, ModelNames
from verinfer.explorer.rows import hx

#: Longest search query read; every id form is shorter (an eigenda pointer aside, which is
#: looked up only if it parses).
MAX_QUERY = 140_000


def search(idx: Index, query: str, names: ModelNames | None = None) -> dict[str, Any]:
    """The page a query names: {"kind", "url"}. Accepts a receipt id, a batch id or batch
    root (0x + 64 hex), an address (0x + 40 hex), a DA pointer (a manifest's or a
    ciphertext's), a challenge id (digits; ``claim N`` for an unpublished claim) and a model
    name (whole or part, any case: one model -> its receipts, several -> the models list)."""
    q = query.strip()
    if not q:
        raise InvalidRequestError("empty search", param="q")
    if len(q) > MAX_QUERY:
        raise InvalidRequestError(f"search of {len(q)} characters: no id is that long",
                                  param="q")
    finders: list[Callable[[], dict[str, Any] | None]]
    if q.startswith("da://"):
        try:
            pointer = str(Pointer.parse(q))
        except MalformedPointerError as e:
            raise InvalidRequestError(e.message, param="q") from e
        finders = [lambda: _hit("batch", hx(idx.batch_by_pointer[pointer]))
                   if pointer in idx.batch_by_pointer else None,
                   lambda: _hit("receipt", hx(idx.receipt_by_ciphertext[pointer]))
                   if pointer in idx.receipt_by_ciphertext else None]
    elif q.lower().startswith("claim ") and q[6:].strip().isdigit():
        n = parse_int_id(q[6:].strip(), "claim_id")
        finders = [lambda: _hit("claim", str(n)) if n in idx.claims else None]
    elif q.isascii() and q.isdigit():
        n = parse_int_id(q, "challenge_id")
        finders = [lambda: _hit("challenge", str(n)) if n in idx.challenges else None]
    elif len(q) == 42 and q[:2].lower() == "0x":
        addr = parse_address(q)
        finders = [lambda: _hit("operator", addr) if addr in idx.accounts else None]
    elif len(q) == 66 and q[:2].lower() == "0x":
        d = parse_id32(q, "q")
        finders = [lambda: _hit("receipt", hx(d)) if d in idx.receipts else None,
                   lambda: _hit("batch", hx(d)) if d in idx.batches else None,
                   lambda: _hit("batch", hx(idx.batches_by_root[d][0]))
                   if d in idx.batches_by_root else None]
    elif q[:2].lower() != "0x" and len(q) <= MAX_NAME and q.isprintable():
        return _model_hit(idx, names or ModelNames(), q)
    else:
        raise InvalidRequestError(
            "search takes a receipt id, batch id or root (0x + 64 hex), an address (0x + 40 "
            f"hex), a DA pointer (da://…), a challenge id (digits), `claim N` or a model name "
            f"(at most {MAX_NAME} printable characters)", param="q")
    with idx.lock:
        for find in finders:
            hit = find()
            if hit is not None:
                return hit
    raise NotFoundError(f"nothing indexed matches {q[:100]}", param="q")


def _model_hit(idx: Index, names: ModelNames, q: str) -> dict[str, Any]:
    with idx.lock:
        hits = find_models(idx, names, q)
    if not hits:
        raise NotFoundError(f"no model named like {q!r} (model names come from the "
                            "deployment's model list and the operator endpoints)", param="q")
    if len(hits) == 1:
        mid = hx(hits[0])
        return {"kind": "model", "id": mid, "url": f"/receipts?model={mid}"}
    return {"kind": "models", "id": q, "url": f"/models?q={quote(q, safe='')}"}


def _hit(kind: str, ident: str) -> dict[str, Any]:
    return {"kind": kind, "id": ident, "url": f"/{kind}/{ident}"}
