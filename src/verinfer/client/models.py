"""The facts about a model the client needs to recompute the request hash itself: the
request rule (verinfer.protocol.request_rule) reads the model id, the tokenizer and the
model's context length and vocabulary, and renders prompts with the engine's tokenizer and
chat template. The client reads them from the model file it approves — metadata only, no
weights are loaded and nothing here imports torch — so it trusts no operator for them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verinfer.client.errors import ClientConfigError
from verinfer.engine.chat import TokenizerPrompts
from verinfer.engine.gguf_file import GGUFFormatError, read_gguf
from verinfer.engine.models.registry import config_from_gguf
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.errors import VerinferError
from verinfer.protocol.request_rule import PromptTokenizer, ServedModel


@dataclass(frozen=True)
class ClientModel:
    """One model the app accepts answers from. ``names``: the served names it answers to (a
    body naming one of them must be answered by this model; an operator's names are its own
    labels, so the client binds them here)."""

    model_id: bytes
    tokenizer_hash: bytes
    context_length: int
    vocab_size: int
    prompts: PromptTokenizer = field(repr=False, compare=False)
    names: tuple[str, ...] = ()

    def served(self, engine_fingerprint: str) -> ServedModel:
        """The model as the request rule sees it, under the fingerprint the receipt names (as
        a verifier applies it: the fingerprint is checked on its own, against the chain)."""
        return ServedModel(model_id=self.model_id, tokenizer_hash=self.tokenizer_hash,
                           engine_fingerprint=engine_fingerprint,
                           context_length=self.context_length, vocab_size=self.vocab_size)

    @classmethod
    def from_gguf(cls, path: str | Path, names: Iterable[str] = ()) -> ClientModel:
        """From the model's GGUF file: its sha256 is the model id; the tokenizer, context
        length and vocabulary come from its metadata."""
        p = Path(path)
        try:
            with p.open("rb") as f:
                model_id = hashlib.file_digest(f, "sha256").digest()
            fields = read_gguf(p, tensors=False).fields
            tokenizer = tokenizer_from_gguf_fields(fields)
            config = config_from_gguf(fields, tokenizer.vocab_size)
        except (OSError, GGUFFormatError) as e:
            raise ClientConfigError(f"cannot read model file {str(p)!r}: {e}",
                                    param="models") from e
        except VerinferError as e:
            raise ClientConfigError(f"model file {str(p)!r} is unusable: {e.message}",
                                    param="models") from e
        return cls(model_id=model_id, tokenizer_hash=tokenizer.hash,
                   context_length=config.context_length, vocab_size=config.vocab_size,
                   prompts=TokenizerPrompts(tokenizer), names=tuple(names))


def model_table(models: Sequence[ClientModel | str | Path]) -> dict[bytes, ClientModel]:
    """Model id -> model; a path is read with :meth:`ClientModel.from_gguf`."""
    out: dict[bytes, ClientModel] = {}
    for m in models:
        cm = m if isinstance(m, ClientModel) else ClientModel.from_gguf(m)
        out[cm.model_id] = cm
    if not out:
        raise ClientConfigError("a verified client needs at least one model it accepts",
                                param="models")
    return out
