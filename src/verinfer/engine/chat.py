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
from verinfer.protocol.request_rule import ROLES, ChatTurn


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


class TokenizerPrompts:
    """The request rule's prompt rendering (verinfer.protocol.request_rule.PromptTokenizer)
    over a real tokenizer: the operator and the verifier both render prompts through this."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def chat(self, messages: Sequence[ChatTurn]) -> list[int]:
        return render_chat(self.tokenizer, [ChatMessage(m.role, m.content) for m in messages])

    def text(self, text: str) -> list[int]:
        spec = self.tokenizer.spec
        bos = [spec.bos_id] if spec.bos_id is not None and spec.add_bos else []
        return bos + _plain(self.tokenizer, text)
