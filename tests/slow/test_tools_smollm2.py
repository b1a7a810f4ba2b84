"""SmolLM2-135M-Instruct's chat template (the ChatML in its GGUF) has no tool syntax: tools, a
history with tool calls and tool results are refused with a clear 400 rather than silently
left out of the prompt; ``tool_choice: none`` shows the model no tools and is served."""

from __future__ import annotations

import json
from typing import Any

import pytest

from verinfer.engine.chat import TokenizerPrompts, ToolsUnsupportedError
from verinfer.engine.loader import smollm2_model_path
from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
from verinfer.engine.tokenizer.spec import read_gguf_tokenizer_fields
from verinfer.protocol.request_rule import ServedModel, plan_request

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
USER = [{"role": "user", "content": "weather in Paris?"}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}


def test_smollm2_refuses_tools_clearly() -> None:
    tok = tokenizer_from_gguf_fields(read_gguf_tokenizer_fields(smollm2_model_path()))
    assert tok.chat_template is not None and "tools" not in tok.chat_template
    served = ServedModel(b"\x02" * 32, tok.hash, "fp", 8192, tok.vocab_size)

    def plan(**fields: Any) -> list[int]:
        body = json.dumps({"model": "smollm2", "messages": USER, "max_tokens": 4, **fields})
        return list(plan_request(body.encode(), "chat", served,
                                 TokenizerPrompts(tok)).requests[0].prompt_token_ids)

    for fields in ({"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": "required"},
                   {"messages": [*USER, {"role": "assistant", "tool_calls": [CALL]},
                                 {"role": "tool", "tool_call_id": "call_1", "content": "sun"}]}):
        with pytest.raises(ToolsUnsupportedError, match="no tool syntax") as e:
            plan(**fields)
        assert e.value.status_code == 400 and e.value.param == "tools"
    assert plan(tools=[TOOL], tool_choice="none") == plan()
