"""The one limits table of the request rule (verinfer.protocol.request_rule).

Every bound an OpenAI body must satisfy lives here, once. The operator refuses a body outside
them with a 400 and the verifier judges a receipt for such a body nonconformant: the two sides
read the same numbers, so an honest operator can never serve a request the committee refuses.
Changing a number is a protocol change (operators and verifiers must move together).
"""

from __future__ import annotations

#: Largest request body (bytes) either side parses.
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Arrays and objects in one body (a chat body of 256 messages has ~260), its strings, and its
#: values (an
#: upper bound counted from the commas: every token id of a prompt given as ids is one). Both
#: are counted on the raw bytes before parsing (verinfer.protocol.jsonsafe.json_shape): 4 MiB of
#: "[1]," is a million lists, seconds of parsing and validation on the operator's event loop.
#: 256 Ki values: as many token ids as MAX_PROMPT_CHARS allows characters of text.
MAX_BODY_CONTAINERS = 4096
#: Strings (keys included; a full chat body has ~1,600), counted first: a million two-byte
#: strings are cheap to send and costly to find.
MAX_BODY_STRINGS = 8192
MAX_BODY_VALUES = 256 * 1024
#: Choices per prompt (``n``).
MAX_CHOICES = 8
#: Prompts in one legacy completions request (``prompt`` as a list).
MAX_PROMPTS = 16
#: Chat messages in one request.
MAX_MESSAGES = 256
#: Characters of prompt text (all messages or prompts together) tokenized for one request:
#: bounds the tokenizer's work before it starts (it is pure Python, ~4 us per character).
MAX_PROMPT_CHARS = 256 * 1024
#: Longest prompt + output (tokens) the protocol carries: the rule reads a model's context as
#: ``min(its own, this)`` (``resolve_max_tokens``), so no valid ExecRequest or ExecResult holds
#: more token ids, and the one CBOR decoder of another party's bytes
#: (``verinfer.protocol.exec_request.decode_cbor``) bounds what it builds by it. 128 Ki: the
#: context of the largest models served (Llama 3.1, Gemma 3, Phi-3.5); a longer one is refused
#: the same way on both sides (400 ``context_length_exceeded``), never served and then refused.
MAX_CONTEXT_TOKENS = 128 * 1024
#: Stop strings, and the longest one (characters).
MAX_STOP = 4
MAX_STOP_CHARS = 256
#: Logprobs alternatives per token: chat ``top_logprobs`` and legacy ``logprobs``.
MAX_TOP_LOGPROBS = 20
MAX_LEGACY_LOGPROBS = 5
#: Decode policy ranges (temperature closed, top_p half-open (0, 1]).
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.0, 2.0
#: The smallest temperature other than 0 (greedy). Below it ``logit / temperature`` overflows a
#: double for ordinary logits (1e-310: +inf, and the sampler's ``z - max z`` is inf - inf =
#: NaN): the sampling kernel's AVX2 exp maps a NaN to its floor where the portable exp keeps
#: the NaN, so two honest machines drew different tokens — and the rule's own definition
#: (engine.sampling.sample_reference) refuses such logits. Well above the overflow bound
#: (~1e-270 for float32 logits) and far below any useful temperature: use 0 for greedy.
MIN_POSITIVE_TEMPERATURE = 1e-6
MAX_TOP_P = 1.0
MAX_TOP_K = 2**32 - 1  # the canonical ExecRequest holds top_k and max_tokens as u32
MAX_MAX_TOKENS = 2**32 - 1
MAX_SEED = 2**64 - 1
#: presence_penalty and frequency_penalty (OpenAI's range), sampling rule vi-sample-v3.
MIN_PENALTY, MAX_PENALTY = -2.0, 2.0
#: logit_bias: at most this many token ids, each biased by a value in [-100, 100] (OpenAI's).
MAX_LOGIT_BIAS_ENTRIES = 300
#: Tools a chat body may declare, and calls one history message may hold (OpenAI's 128).
MAX_TOOLS = 128
MAX_ABS_LOGIT_BIAS = 100.0
#: Integers written as JSON floats (``8.0``) are accepted only where the double is exact.
MAX_EXACT_FLOAT_INT = 2**53

#: Defaults of omitted fields (OpenAI's documented defaults).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_N = 1
#: max_tokens of a body without one: this many, or the room the prompt leaves in the *model's*
#: context when that is less. Legacy completions: 16 (OpenAI's default). Chat: 256, not "the
#: rest of the context" (OpenAI's wording): the KV cache is allocated for prompt + max_tokens up
#: front, and servers run windows far smaller than the model's context (Gemma 3: 32768), so a
#: context-sized default would make every request without a limit unservable.
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 256
