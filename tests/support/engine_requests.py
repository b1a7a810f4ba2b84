"""ExecRequests straight from an engine and SamplingParams, for tests that exercise the canonical
encodings without the request rule (production builds them with the rule:
``protocol/request_rule.py``). Not in ``receipts``: receipts sit below the engine and must not
import it (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Sequence

from verinfer.engine.engine import Engine
from verinfer.protocol.exec_request import ExecRequest
from verinfer.protocol.sampling_params import SamplingParams


def exec_request_for(engine: Engine, prompt_token_ids: Sequence[int], params: SamplingParams,
                     prompt_commitments: bytes | None = None,
                     top_logprobs: int | None = None) -> ExecRequest:
    """The request as ``engine`` will run it (checked by ``engine.check_request``)."""
    engine.check_request(prompt_token_ids, params)
    return ExecRequest.from_params(model_id=engine.model_id, tokenizer_hash=engine.tokenizer.hash,
                                   engine_fingerprint=engine.fingerprint.canonical().decode(),
                                   prompt_token_ids=prompt_token_ids, params=params,
                                   prompt_commitments=prompt_commitments,
                                   top_logprobs=top_logprobs)
