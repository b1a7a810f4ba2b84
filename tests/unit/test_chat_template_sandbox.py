"""A hostile chat template in a model file (approved by model id, but still code from a file):
every way to run long or build something huge is cut by a count, never a clock, and the same
render spends the same budget every time -- so operator and verifier refuse the same requests.
Also: strftime_now is pinned (and injectable), and an honest template renders unchanged."""

from __future__ import annotations

from datetime import UTC, datetime

import jinja2
import pytest

from verinfer.engine.tokenizer.chat_template import (
    PINNED_NOW,
    RenderBudget,
    RenderBudgetError,
    compile_template,
    render_template_text,
)
from verinfer.errors import TokenizerError

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _render(template: str, content: str = "hi", **kw: object) -> str:
    messages = [{"role": "user", "content": content}]
    budget = RenderBudget.for_inputs(len(content))
    return render_template_text(template, {"messages": messages, "add_generation_prompt": True},
                                budget=budget, **kw)  # type: ignore[arg-type]


def test_honest_template_renders_as_jinja_does() -> None:
    content = "Count: 1 2 3 …  then\n\nnewlines 😀 東京 " * 50
    plain = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(CHATML)
    want = plain.render(messages=[{"role": "user", "content": content}],
                        add_generation_prompt=True)
    assert _render(CHATML, content) == want


# constructs of popular templates (Llama 3.x, Qwen, Mistral): namespaces, the clock, trim,
# map/selectattr/join, tojson(indent), format, arithmetic, slicing, loop variables
POPULAR = """{{- bos_token }}
{%- set ns = namespace(n=0) -%}
{%- set date_string = strftime_now("%d %b %Y") %}
{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}
{%- set messages = messages[1:] %}{%- else %}{%- set system_message = "" %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\nToday Date: " + date_string }}
{{- system_message + "<|eot_id|>" }}
{%- for message in messages %}{%- set ns.n = ns.n + 1 %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n' + message['content']|trim }}
{%- if loop.last %}{{ (messages|map(attribute='role')|join(', ')) ~ ' ' ~ ns.n }}{% endif %}
{%- endfor %}
{{ {'a': [1, 2], 'b': 'x'}|tojson(indent=4) }}{{ "%s-%d"|format("q", 3) }}{{ '{}!'.format('x') }}
{{ messages|selectattr('role', 'equalto', 'user')|list|length }}{{ range(3)|list|sum }}
{{ 7 // 2 }}{{ -3 }}{{ 2 ** 10 }}{{ 'ab' * 3 }}{{ [1] + [2] }}{{ 'x'|center(5) }}{{ 'l'|upper }}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>' }}{%- endif %}"""


def test_popular_constructs_render_as_transformers_does() -> None:
    """Same output as transformers' environment (no budget) with the same pinned clock."""
    import json

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, indent=indent)
    msgs = [{"role": "system", "content": " Be nice. "}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]
    variables = {"messages": msgs, "add_generation_prompt": True, "bos_token": "<s>"}
    want = env.from_string(POPULAR).render(
        **variables, strftime_now=lambda fmt: PINNED_NOW.strftime(fmt))
    got = render_template_text(POPULAR, variables, budget=RenderBudget.for_inputs(30))
    assert got == want and "Today Date: 01 Jan 2026" in got


def test_big_honest_content_fits_its_budget() -> None:
    content = "word " * 800_000  # 4 MB: the budget scales with the messages
    assert len(_render(CHATML, content)) > len(content)


def test_strftime_now_is_pinned_and_injectable() -> None:
    t = "Today: {{ strftime_now('%d %b %Y') }}|{{ messages[0]['content'] }}"
    assert _render(t) == _render(t) == PINNED_NOW.strftime("Today: %d %b %Y") + "|hi"
    later = datetime(2031, 7, 4, tzinfo=UTC)
    assert _render(t, now=later) == "Today: 04 Jul 2031|hi"


def test_spending_is_deterministic() -> None:
    t = "{% for i in range(5000) %}{% if i % 7 == 0 %}{{ i ~ messages[0]['content'] }}" \
        "{% endif %}{% endfor %}"
    spent = []
    for _ in range(3):
        budget = RenderBudget.for_inputs(2)
        render_template_text(t, {"messages": [{"role": "user", "content": "hi"}]}, budget=budget)
        spent.append((budget.steps, budget.work))
    assert spent[0] == spent[1] == spent[2]
    assert spent[0][0] < RenderBudget.for_inputs(2).steps  # lines were counted


ATTACKS = {
    "nested_loops_no_output":
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "recursive_macro": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "string_doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "string_plus_doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                            "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "list_doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
                     "{% set ns.l = ns.l + ns.l %}{% endfor %}",
    "repeat_literal": "{{ 'x' * 10**9 }}",
    "repeat_list": "{{ ([messages] * 10**8)|length }}",
    "tower_power": "{{ 10 ** 10 ** 10 }}",
    "squaring_loop": "{% set ns = namespace(x=3) %}{% for i in range(100) %}"
                     "{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "center_width": "{{ 'x'|center(10**9) }}",
    "ljust_method": "{{ 'x'.ljust(10**9) }}",
    "percent_width": "{{ '%0999999999d' % 1 }}",
    "format_method_width": "{{ '{:>999999999}'.format(1) }}",
    "format_filter_width": "{{ '%999999999s'|format('x') }}",
    "join_filter": "{{ ([messages[0]['content'] * 1000] * 100000)|join }}",
    "join_method": "{{ ''.join([messages[0]['content'] * 1000] * 100000) }}",
    "replace_method": "{{ (messages[0]['content'] * 1000).replace('', 'y' * 1000) }}",
    "replace_filter": "{{ (messages[0]['content'] * 1000)|replace('h', 'y' * 100000) }}",
    "indent_filter": "{{ ('a\\n' * 100000)|indent(1000) }}",
    "output_flood": "{% for i in range(100000) %}{{ messages[0]['content'] * 100 }}{% endfor %}",
}


@pytest.mark.parametrize("template", ATTACKS.values(), ids=list(ATTACKS))
def test_hostile_template_is_cut(template: str) -> None:
    with pytest.raises(RenderBudgetError):
        _render(template)


def test_recursion_is_cut_by_a_count_not_by_the_callers_stack() -> None:
    """The same template fails the same way whether rendered from a shallow or a deep stack."""
    ok = "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}x{% endmacro %}{{ f(30) }}"
    deep = ok.replace("f(30)", "f(60)")

    def nested(levels: int, template: str) -> str:
        return nested(levels - 1, template) if levels else _render(template)

    for stack in (0, 600):
        assert nested(stack, ok) == "x" * 31
        with pytest.raises(RenderBudgetError, match="recurses"):
            nested(stack, deep)


def test_compile_time_folding_cannot_hang() -> None:
    # intercepted operators are not folded by Jinja's optimizer: compiling is instant
    compile_template("{{ 9 ** 9 ** 9 ** 9 }}")


def test_templates_render_only_under_a_budget() -> None:
    with pytest.raises(RenderBudgetError):
        compile_template("{{ 1 + 1 }}").render()


def test_syntax_error_is_typed() -> None:
    with pytest.raises(TokenizerError, match="does not compile"):
        compile_template("{% for %}")
