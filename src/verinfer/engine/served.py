"""What the request rule (verinfer.protocol.request_rule) reads from an engine: the facts of its
model and its prompt rendering. The operator plans its jobs and the verifier checks conformance
through this one adapter, so both read the same facts the same way."""

from __future__ import annotations

from verinfer.engine.chat import TokenizerPrompts
from verinfer.engine.engine import Engine
from verinfer.protocol.request_rule import ServedModel


def served_model(engine: Engine, engine_fingerprint: str | None = None) -> ServedModel:
    """``engine``'s model as the rule sees it. The context length is the model's own (bound to
    its weights hash), never a server's smaller ``--max-context`` window: an omitted max_tokens
    must not depend on how an operator configured its server. A verifier passes the
    fingerprint the ExecRequest names (a judge need not run the operator's kernels)."""
    return ServedModel(
        model_id=engine.model_id,
        tokenizer_hash=engine.tokenizer.hash,
        engine_fingerprint=(engine_fingerprint if engine_fingerprint is not None
                            else engine.fingerprint.canonical().decode()),
        context_length=engine.config.context_length,
        vocab_size=engine.config.vocab_size)


def prompt_tokenizer(engine: Engine) -> TokenizerPrompts:
    return TokenizerPrompts(engine.tokenizer)
