"""Does the ExecRequest the operator ran follow the client's request body?

The envelope carries the OpenAI request body exactly as received. A sealed ExecRequest conforms
iff ``request in exec_requests(body)``: the protocol's request rule
(verinfer.protocol.request_rule), the very function the operator planned its jobs with, applied
to the same bytes. This catches cheats that replay cannot — an injected system prompt, another
seed, other sampling options, a max_tokens the body did not ask for — and it cannot drift from
the serving code, because there is no second copy of the rule.
"""

from __future__ import annotations

from dataclasses import fields

from verinfer.engine.engine import Engine
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.errors import VerinferError
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.request_rule import exec_requests


def request_problems(engine: Engine, request: ExecRequest, request_body: bytes) -> list[str]:
    """Every way ``request`` departs from what ``request_body`` asks for (empty: conformant).
    ``engine`` runs the request's model (checked before: reexec.check_engine). The messages
    name fields only, never their contents (they leave the enclave)."""
    model = served_model(engine, request.engine_fingerprint)
    try:
        honest = exec_requests(request_body, model, prompt_tokenizer(engine))
    except VerinferError as e:
        # a body an honest server refuses: serving it at all departs from the protocol
        return [f"an honest server refuses this request body ({type(e).__name__}"
                f"{', ' + e.param if e.param else ''})"]
    if request in honest:
        return []
    return [_closest_difference(request, honest)]


def _closest_difference(request: ExecRequest, honest: tuple[ExecRequest, ...]) -> str:
    """Names the fields in which ``request`` differs from the honest request it is nearest to
    (fewest differing fields): a diagnosis for the vote's detail, not part of the verdict."""
    names = [f.name for f in fields(ExecRequest)]
    diffs = [[n for n in names if getattr(request, n) != getattr(h, n)] for h in honest]
    best = min(diffs, key=len)
    return "differs from the request body's ExecRequest in " + ", ".join(best)
