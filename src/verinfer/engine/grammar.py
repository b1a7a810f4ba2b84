"""The grammar mask of sampling rule ``vi-sample-v3`` over the engine's tokenizer.

:class:`GrammarTokenizer` presents a :class:`~verinfer.engine.tokenizer.base.Tokenizer` to
llguidance (each id's bytes, the control tokens, the EOS/EOT ids the stop rule ends on), once
per engine. :class:`OutputState` is one output's v3 state: the token counts the penalties read
and, for a grammar-constrained request, a fresh llguidance matcher fed the output tokens in
order. A fresh matcher per output (decode or replay) keeps every mask a function of the grammar,
the tokenizer and the output so far, nothing else (no state shared between requests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from verinfer.engine.sampling import sample_v3
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.errors import InvalidRequestError
from verinfer.protocol.grammar import Grammar, parser_limits
from verinfer.protocol.sampling_params import SamplingParams


class _Wrapper:
    """What llguidance's TokenizerWrapper reads from a tokenizer."""

    def __init__(self, tok: Tokenizer) -> None:
        spec = tok.spec
        self._tok = tok
        self.eos_token_id = spec.eot_ids[0] if spec.eot_ids else spec.eos_id
        self.bos_token_id = spec.bos_id
        self.special_token_ids = [i for i in range(tok.vocab_size) if tok.is_special(i)]
        self.tokens = [tok.token_bytes(i) for i in range(tok.vocab_size)]

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, add_bos=False, add_eos=False, parse_special=False)


class GrammarTokenizer:
    """llguidance's view of one tokenizer (built once, ~1 s; thread-safe to share)."""

    def __init__(self, tok: Tokenizer, vocab_size: int) -> None:
        import llguidance

        self.tokenizer = tok
        self.vocab_size = vocab_size  # the model's (logit rows), may exceed the tokenizer's
        eot = list(tok.spec.eot_ids) or ([tok.spec.eos_id] if tok.spec.eos_id is not None
                                         else [])
        if not eot:
            raise InvalidRequestError("this model's tokenizer has no EOS token: structured "
                                      "outputs need one", param="response_format")
        self.fallback = eot[0]
        self.ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapper(tok)),
                                         n_vocab=tok.vocab_size, eos_token=eot)

    def matcher(self, grammar: Grammar) -> Any:
        import llguidance

        m = llguidance.LLMatcher(self.ll, grammar.grammar_text(), log_level=0,
                                 limits=parser_limits())
        if m.is_error():
            raise InvalidRequestError(f"the grammar does not compile for this tokenizer: "
                                      f"{m.get_error()[:300]}", param="response_format")
        return m


_CACHE_LOCK = threading.Lock()


def grammar_tokenizer(owner: Any, tok: Tokenizer, vocab_size: int) -> GrammarTokenizer:
    """The :class:`GrammarTokenizer` cached on ``owner`` (an engine)."""
    with _CACHE_LOCK:
        gt = getattr(owner, "_grammar_tokenizer", None)
        if gt is None:
            gt = GrammarTokenizer(tok, vocab_size)
            owner._grammar_tokenizer = gt
        return gt


class OutputState:
    """One output's vi-sample-v3 state: ``choose`` the token at a position, ``push`` it."""

    def __init__(self, params: SamplingParams, gt: GrammarTokenizer | None) -> None:
        self.params = params
        self.counts: dict[int, int] = {}
        self.matcher = gt.matcher(params.grammar) if params.grammar is not None and gt else None
        self.fallback = gt.fallback if gt is not None else 0
        self.vocab = gt.vocab_size if gt is not None else 0
        self.tok_vocab = gt.tokenizer.vocab_size if gt is not None else 0
        self.mask_seconds = 0.0  # time spent computing grammar masks (bench/serve.py)

    def allowed(self) -> np.ndarray | None:
        if self.matcher is None:
            return None
        t0 = time.perf_counter()
        out = np.zeros(self.vocab, dtype=bool)
        if not self.matcher.is_error():
            bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8),
                                 bitorder="little")
            n = min(self.vocab, bits.shape[0], self.tok_vocab)  # ids past the tokenizer's:
            out[:n] = bits[:n].astype(bool)  # never allowed
        self.mask_seconds += time.perf_counter() - t0
        return out

    def choose(self, logits: np.ndarray, position: int) -> int:
        return sample_v3(logits, self.params, position, counts=self.counts,
                         allowed=self.allowed(), fallback=self.fallback)

    def push(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1
        if self.matcher is not None and not self.matcher.is_error():
            t0 = time.perf_counter()
            self.matcher.consume_token(token)
            self.mask_seconds += time.perf_counter() - t0

    def run(self, rows: np.ndarray, positions: Sequence[int], claimed: Sequence[int]
            ) -> list[int]:
        """Replay: the rule's token for each row, pushing the *claimed* token after each (the
        state a decode that produced the claim had); stops after the first disagreement."""
        out = []
        for row, pos, tok in zip(rows, positions, claimed, strict=False):
            mine = self.choose(row, pos)
            out.append(mine)
            if mine != tok:
                break
            self.push(tok)
        return out
