"""Does the ExecRequest the operator ran follow the client's request body?

The envelope carries the OpenAI request body exactly as received. A verifier recomputes from it
what an honest server must run — prompt token ids (chat template or completion prompt), decode
policy and seed — and compares with the sealed ExecRequest. This catches cheats that replay
cannot: an injected system prompt, another seed, other sampling options. The rules mirror the
serving code (verinfer.operator.generation) and are part of the protocol (docs/verifier.md §3).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from verinfer.engine.chat import ChatMessage, render_chat
from verinfer.engine.sampling import choice_seed, request_seed
from verinfer.engine.tokenizer import Tokenizer
from verinfer.errors import VerinferError
from verinfer.receipts.canonical import ExecRequest

MAX_CHOICES = 8


def _prompts(tokenizer: Tokenizer, body: dict[str, Any]) -> list[list[int]]:
    if "messages" in body:
        msgs = body["messages"]
        if not isinstance(msgs, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in msgs):
            raise ValueError("messages is not a list of {role, content} objects")
        return [render_chat(tokenizer, [ChatMessage(m["role"], m["content"]) for m in msgs])]
    prompt = body.get("prompt")
    spec = tokenizer.spec
    bos = [spec.bos_id] if spec.bos_id is not None and spec.add_bos else []
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(type(x) is int for x in prompt):
        items = [prompt]
    elif isinstance(prompt, list):
        items = prompt
    else:
        raise ValueError("the body has neither messages nor prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(bos + tokenizer.encode(item, add_bos=False, parse_special=False))
        elif isinstance(item, list) and all(type(x) is int for x in item):
            out.append(list(item))
        else:
            raise ValueError("prompt items must be strings or token id lists")
    return out


def request_problems(tokenizer: Tokenizer, request: ExecRequest,
                     request_body: bytes) -> list[str]:
    """Every way ``request`` departs from what ``request_body`` asks for (empty: conformant).
    The messages name fields only, never their contents (they leave the enclave)."""
    try:
        body = json.loads(request_body)
    except ValueError:
        return ["request body is not JSON"]
    if not isinstance(body, dict):
        return ["request body is not a JSON object"]
    problems: list[str] = []
    try:
        prompts = _prompts(tokenizer, body)
    except (ValueError, VerinferError) as e:
        return [f"request body has no valid prompt ({type(e).__name__})"]
    if list(request.prompt_token_ids) not in prompts:
        problems.append("prompt_token_ids differ from the rendered request body")

    n = body.get("n") if body.get("n") is not None else 1
    base = body.get("seed")
    if base is None:
        # the policy fields are checked against the body below; here they only key the seed
        # API requests never set ignore_eos: derive as the operator does from such a body
        base = request_seed("0x" + request.model_id.hex(), request.prompt_token_ids,
                            replace(request.sampling_params(), ignore_eos=False))
    if type(base) is not int or type(n) is not int or not 1 <= n <= MAX_CHOICES:
        problems.append("seed or n in the body is malformed")
    elif request.seed not in {choice_seed(base, i) for i in range(n)}:
        problems.append("seed differs from the body's seed (or the one derived from it)")

    def expect(name: str, got: object, want: object) -> None:
        if got != want:
            problems.append(f"{name} differs from the request body")

    expect("temperature", request.temperature,
           1.0 if body.get("temperature") is None else body["temperature"])
    expect("top_p", request.top_p, 1.0 if body.get("top_p") is None else body["top_p"])
    expect("top_k", request.top_k, body.get("top_k") or 0)
    stop = body.get("stop")
    expect("stop", request.stop, (stop,) if isinstance(stop, str) else tuple(stop or ()))
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if limit is not None:  # absent: up to the server's context limit, not checkable here
        expect("max_tokens", request.max_tokens, limit)
    expect("ignore_eos", request.ignore_eos, False)
    pc = body.get("prompt_commitments")
    want_pc = None
    if isinstance(pc, str):
        try:
            want_pc = bytes.fromhex(pc.removeprefix("0x"))
        except ValueError:
            want_pc = b"malformed"
    expect("prompt_commitments", request.prompt_commitments, want_pc)
    return problems


def body_prompts(tokenizer: Tokenizer, request_body: bytes) -> Sequence[list[int]]:
    """The prompts an honest server renders from a body (for tests and tooling)."""
    return _prompts(tokenizer, json.loads(request_body))
