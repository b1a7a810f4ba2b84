"""A chat template is code inside the model file, rendered by the operator and again by every
verifier (the request rule turns messages into prompt token ids). Whoever ships the template --
a model publisher, or an operator who gets its own model file approved -- attacks the render:

- randomness: a prompt that differs between operator and verifier;
- memory bombs the budget let through because it checked the size *after* building the value.

Each must end in the same deterministic refusal on every machine, before any large allocation.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import jinja2
import pytest

from verinfer.engine.tokenizer.chat_template import RenderBudget, render_template_text

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
#: what a render may allocate at its peak here: the budget is ~1 MiB of text
PEAK_BYTES = 40 << 20


def _render(template: str) -> str:
    return render_template_text(template, {"messages": MESSAGES},
                                budget=RenderBudget.for_inputs(7))


@pytest.fixture
def traced() -> Iterator[None]:
    """Traces allocations during the test: ``_peak()`` is the largest the body reached."""
    tracemalloc.start()
    yield
    tracemalloc.stop()


def _peak() -> int:
    return tracemalloc.get_traced_memory()[1]


@pytest.mark.parametrize("template", [
    "{{ lipsum(1, False, 5, 9) }}",
    "{{ ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']|random }}",
])
def test_random_template_functions_are_refused(template: str) -> None:
    """Jinja's ``lipsum()`` and ``|random`` draw from Python's unseeded ``random``: the operator
    and a verifier rendered different prompts from the same request. Who gains: the template's
    author -- an honest operator serving the model is voted INVALID_EVIDENCE (its prompt is not
    what the verifiers' request rule renders) and slashed, or an operator knows in advance that
    no receipt of that model can be judged; it costs one approved model file. Now both raise
    the same sandbox error everywhere, so every side refuses the request alike."""
    with pytest.raises(jinja2.exceptions.SecurityError, match="random"):
        _render(template)


def test_tojson_indent_memory_bomb_is_refused_before_it_is_built(traced: None) -> None:
    """``messages|tojson(indent=N)`` repeats N spaces on every line: the budget checked the
    rendered size only after json built it (10 lines x 10**7 = 100 MB here; 10**10 is an OOM
    kill of the verifier). Who gains: the template's author, whose receipts no verifier can
    judge; cost: one approved model file. Now the indented size is bounded from the compact
    JSON before it is built."""
    with pytest.raises(jinja2.exceptions.SecurityError, match="JSON text"):
        _render("{{ messages|tojson(indent=10000000) }}")
    assert _peak() < PEAK_BYTES, _peak()
    assert _render("{{ messages|tojson(indent=2) }}").count("\n") == 9  # legit use still works


@pytest.mark.parametrize("template", [
    "{{ (messages|slice(3000000)|list)|length }}",
    "{{ (messages|batch(20000000, 'x')|list)|length }}",
])
def test_slice_and_batch_count_bombs_are_refused_before_they_run(
        template: str, traced: None) -> None:
    """``slice(n)`` yields n lists whatever its input; ``batch(n, fill)`` pads its last list to
    n items. The count was charged as work but never checked as a size, so the list was built
    first (3 million lists take seconds and ~100 MB here; 10**9 is minutes and an OOM). Who
    gains and what it costs: as above. Now n is checked against the size budget first."""
    with pytest.raises(jinja2.exceptions.SecurityError, match="list of"):
        _render(template)
    assert _peak() < PEAK_BYTES, _peak()


@pytest.mark.parametrize("template", [
    "{{ '%*d' % (100000000, 1) }}",
    "{{ '%*d'|format(100000000, 1) }}",
    "{{ '{:>{w}}'.format('a', w=100000000) }}",
])
def test_a_width_taken_from_the_arguments_is_refused(template: str, traced: None) -> None:
    """The size estimate of a format counts the digits written in the format string, but a
    ``*`` (printf) or a nested ``{w}`` (str.format) takes the width from an argument: a 100 MB
    string here, 10**10 an OOM. Who gains and what it costs: as above. Now such formats are
    refused (no bound can know which argument is a width); widths written in the template,
    and JSON-like braces in a printf format, still work."""
    with pytest.raises(jinja2.exceptions.SecurityError, match="width from its arguments"):
        _render(template)
    assert _peak() < PEAK_BYTES, _peak()
    assert _render("{{ '%5d|{\"a\": {\"b\": %s}}' % (7, 1) }}") == '    7|{"a": {"b": 1}}'
    assert _render("{{ '{:>4}{x}'.format('a', x=1) }}") == "   a1"


@pytest.mark.parametrize("template", [
    "{% set b = [a] * 1000 %}{{ [b] * 30 }}",
    "{% set b = [a, a, a, a, a, a, a, a, a, a] %}{% set c = [b, b, b, b, b, b, b, b, b, b] %}"
    "{{ 'x' ~ [c, c, c, c, c, c, c, c, c, c] }}",
    "{% set b = [a] * 1000 %}{{ ([b] * 30)|tojson }}",
    "{{ messages|tojson(separators=(' ' * 1000000, ':')) }}",
])
def test_shared_references_and_separators_cannot_print_past_the_budget(
        template: str, traced: None) -> None:
    """Sizes were checked as ``len``: ``[b] * 30`` is a list of 30, but each item is the same
    1000-list of 1000-lists, and printing it (``{{ }}``, ``~``, ``tojson``) builds 30 million
    numbers -- 150 MB and seconds here, ``* 1000`` is 5 GB. A separator of a million spaces
    repeats between every two items of a tojson. Who gains and what it costs: as above.
    Now a printed value's size is counted over its tree (stopping at the budget) before it
    is printed, and tojson bounds its separators as it bounds its indent."""
    with pytest.raises(jinja2.exceptions.SecurityError, match=r"nested value|JSON text"):
        render_template_text("{% set a = range(1000)|list %}" + template,
                             {"messages": MESSAGES}, budget=RenderBudget.for_inputs(7))
    assert _peak() < PEAK_BYTES, _peak()


def test_a_template_that_reads_message_content_renders_alike_every_time() -> None:
    """render_chat renders the template once over placeholder marks (to find where each
    message sits) and once over the real messages, and refuses the request when the two
    disagree outside the messages. The marks held a fresh random nonce per call, so a template
    that tests the content (``'7' in content``) saw a different placeholder each time: the
    same request was accepted by one render and refused by the next (1 in 5 here). Who gains:
    the template's author -- an honest operator serving such a model has its receipts voted
    INVALID_EVIDENCE by whichever verifiers' renders refused (the request rule refuses the
    body, so the ExecRequest "departs" from it); it costs one approved model file. Now the
    nonce is a function of the messages: every render of a request decides alike."""
    from verinfer.engine.chat import ChatMessage, render_chat
    from verinfer.engine.loader import smollm2_model_path
    from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields
    from verinfer.engine.tokenizer.spec import read_gguf_tokenizer_fields
    from verinfer.errors import InvalidRequestError

    template = ("{% for m in messages %}{% if '7' in m['content'] %}[seven]{% endif %}"
                "<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    fields = read_gguf_tokenizer_fields(smollm2_model_path())
    tok = tokenizer_from_gguf_fields(dict(fields, **{"tokenizer.chat_template": template}))
    for content in ("a7", "b7", "no digit seven here", "c7d7e7"):
        outcomes = set()
        for _ in range(40):
            try:
                outcomes.add(tuple(render_chat(tok, [ChatMessage("user", content)])))
            except InvalidRequestError as e:
                outcomes.add(("refused", e.message))
        assert len(outcomes) == 1, (content, outcomes)
