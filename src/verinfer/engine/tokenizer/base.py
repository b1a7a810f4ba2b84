"""The one tokenizer interface: :class:`Tokenizer`.

Every implementation (SentencePiece BPE in :mod:`.spm`, byte-level BPE and ``tokenizer.json``
delegates in :mod:`.bytelevel`) is a subclass built from a :class:`TokenizerSpec`; everything
above the engine (chat rendering, the request rule, serving, replay) sees only this class. The
shared parts live here so they cannot drift apart between families: the hash of the spec, id
checks, special-token classification and decoding (the bytes each token stands for come from
the implementation; concatenation, the space-prefix strip and UTF-8 replacement are common).
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from functools import cached_property

from verinfer.engine.tokenizer.spec import (
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TokenizerSpec,
)
from verinfer.errors import TokenizerError


class Tokenizer(abc.ABC):
    """A tokenizer defined by a :class:`TokenizerSpec`. Build one with the factories of
    :mod:`verinfer.engine.tokenizer.load` (``tokenizer_from_gguf``, ``tokenizer_from_spec``,
    ...): the base class knows none of its implementations. Decode incrementally with
    :class:`verinfer.engine.tokenizer.stream.StreamDecoder`."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        n = len(spec.tokens)
        self._types: tuple[int, ...] = (
            spec.token_types if spec.token_types is not None else (TOKEN_NORMAL,) * n)
        self._token_to_id: dict[str, int] = {t: i for i, t in enumerate(spec.tokens)}
        self._bytes_cache: dict[int, bytes] = {}

    # -- identity -------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.spec.tokens)

    @cached_property
    def hash(self) -> bytes:
        """sha256 (32 bytes) of :meth:`TokenizerSpec.canonical_json` (format
        ``verinfer.tokenizer.spec/1``: sorted-key, whitespace-free, ASCII JSON of every spec
        field plus ``"format"``; scores as ``float.hex`` of their float32 value). The chat
        template, where chat prompts are rendered from one, is a spec field: the hash commits
        to how a conversation becomes token ids, not only to how text does."""
        return hashlib.sha256(self.spec.canonical_json()).digest()

    @property
    def chat_template(self) -> str | None:
        return self.spec.chat_template

    def token_to_id(self, s: str) -> int | None:
        return self._token_to_id.get(s)

    def id_to_token(self, token_id: int) -> str:
        self._check_id(token_id)
        return self.spec.tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        """Control (or unknown-type) token: dropped by ``decode(skip_special=True)``."""
        self._check_id(token_id)
        return self._types[token_id] in (TOKEN_CONTROL, TOKEN_UNKNOWN)

    def _check_id(self, token_id: int) -> None:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise TokenizerError(f"token id must be an int, got {type(token_id).__name__}")
        if token_id < 0 or token_id >= len(self.spec.tokens):
            raise TokenizerError(
                f"token id {token_id} is outside the vocabulary ({self.vocab_size})"
            )

    # -- encoding -------------------------------------------------------------------------------
    def encode(
        self,
        text: str,
        *,
        add_bos: bool | None = None,
        parse_special: bool = True,
        add_eos: bool | None = None,
    ) -> list[int]:
        """Token ids of ``text``. ``add_bos``/``add_eos``: None -> the spec's default.
        ``parse_special``: match control tokens such as ``<start_of_turn>`` in the text."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects str, got {type(text).__name__}")
        spec = self.spec
        out: list[int] = []
        if add_bos if add_bos is not None else spec.add_bos:
            if spec.bos_id is None:
                raise TokenizerError("this tokenizer has no BOS token")
            out.append(spec.bos_id)
        self._encode_into(text, parse_special, out)
        if add_eos if add_eos is not None else spec.add_eos:
            if spec.eos_id is None:
                raise TokenizerError("this tokenizer has no EOS token")
            out.append(spec.eos_id)
        return out

    @abc.abstractmethod
    def _encode_into(self, text: str, parse_special: bool, out: list[int]) -> None:
        """Append the ids of ``text`` (no BOS/EOS) to ``out``."""

    # -- decoding -------------------------------------------------------------------------------
    @abc.abstractmethod
    def _raw_token_bytes(self, token_id: int) -> bytes:
        """The bytes a (checked) token id stands for in decoded text."""

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for in decoded text (control tokens: their text)."""
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        self._check_id(token_id)
        b = self._raw_token_bytes(token_id)
        self._bytes_cache[token_id] = b
        return b

    def decode_bytes(self, ids: Sequence[int], *, skip_special: bool = True) -> bytes:
        """Concatenated token bytes (with the space-prefix strip of :meth:`decode`)."""
        buf = bytearray()
        types = self._types
        strip = self.spec.add_space_prefix
        for tid in ids:
            self._check_id(tid)
            if skip_special and types[tid] in (TOKEN_CONTROL, TOKEN_UNKNOWN):
                continue
            b = self.token_bytes(tid)
            if strip and b:
                if b[:1] == b" ":
                    b = b[1:]
                strip = False
            buf += b
        return bytes(buf)

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``: each token's bytes, control tokens dropped when ``skip_special``;
        UTF-8 with ``errors="replace"`` applied once at the end. With ``add_space_prefix`` the
        first emitted token loses one leading space."""
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")
