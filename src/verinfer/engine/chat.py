"""Chat templates: OpenAI messages → prompt token ids.

Gemma's turn format is used whenever the vocabulary has its turn tokens (Gemma 3, and our tiny
test model); otherwise a plain "role: content" transcript. System messages are folded into the
first user turn, as Gemma's own template does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verinfer.engine.tokenizer import Tokenizer
from verinfer.errors import InvalidRequestError

ROLES = ("system", "developer", "user", "assistant")


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


def render_chat(tokenizer: Tokenizer, messages: Sequence[ChatMessage]) -> list[int]:
    if not messages:
        raise InvalidRequestError("messages must not be empty", param="messages")
    system = [m.content for m in messages if m.role in ("system", "developer")]
    turns = [m for m in messages if m.role not in ("system", "developer")]
    for m in messages:
        if m.role not in ROLES:
            raise InvalidRequestError(f"unsupported role {m.role!r}", param="messages")
    if not turns:
        raise InvalidRequestError("messages need at least one user turn", param="messages")
    sot, eot = tokenizer.token_to_id("<start_of_turn>"), tokenizer.token_to_id("<end_of_turn>")
    # Turn markers are inserted as ids and message text is encoded with special-token parsing
    # off, so a user cannot forge a turn by typing "<start_of_turn>". Tokenization still splits
    # at the markers exactly as encoding the rendered template would.
    bos = tokenizer.spec.bos_id
    ids: list[int] = [bos] if bos is not None and tokenizer.spec.add_bos else []
    for i, m in enumerate(turns):
        content = m.content
        if i == 0 and system:
            content = "\n\n".join(system) + "\n\n" + content
        if sot is not None and eot is not None:
            role = "model" if m.role == "assistant" else "user"
            ids += [sot, *_plain(tokenizer, f"{role}\n{content}"), eot]
            ids += _plain(tokenizer, "\n")
        else:
            ids += _plain(tokenizer, f"{m.role}: {content}\n")
    if sot is not None and eot is not None:
        return [*ids, sot, *_plain(tokenizer, "model\n")]
    return ids + _plain(tokenizer, "assistant:")


def _plain(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_bos=False, parse_special=False)
