"""Chat templates (Jinja2, from the model file) compiled as HF transformers compiles them, in a
sandbox that also bounds what a render may cost.

transformers (``_compile_jinja_template``) uses an ``ImmutableSandboxedEnvironment`` with
``trim_blocks``, ``lstrip_blocks`` and the ``loopcontrols`` extension, a non-HTML-escaping
``tojson`` filter, and the globals ``raise_exception`` and ``strftime_now``; its ``namespace``
refuses underscore-prefixed attributes. All of that is reproduced here, with two differences:

* ``strftime_now`` formats a *pinned* instant (:data:`PINNED_NOW`, or the ``now`` a caller
  passes): a prompt must be a pure function of the request, or a verifier re-rendering it a
  minute later would get other token ids than the operator did.
* A template is code shipped inside a model file. Jinja's sandbox stops attribute escapes and
  caps ``range()``, but not loops over big inputs, string doubling (``s ~ s`` in a loop),
  ``'x' * 10**9``, ``10 ** 10 ** 10`` (folded at compile time!) or ``center(10**9)``. Every
  render here runs against a :class:`RenderBudget`, and every limit is a count of template
  lines executed or of characters/items touched -- never a clock -- so an operator and a
  verifier refuse exactly the same requests on any machine:

  - ``steps``: template lines executed (a trace hook on the compiled template's own frames);
  - ``size``: the largest string/list any operation may build, and the rendered output's size
    (estimated *before* the operation where it could allocate: ``*``, ``~``, ``+``, ``%``,
    ``join``, ``replace``, ``center``/``indent``/... widths);
  - ``work``: the total characters and items passed to every call, filter and operator;
  - integers: any integer operand, argument or result beyond ``2**63`` is refused;
  - depth: template frames nested (macro or recursive-loop recursion) beyond :data:`MAX_DEPTH`.

  Exceeding one raises :class:`RenderBudgetError` (a Jinja ``SecurityError``). Widths a
  format takes from its arguments (``'%*d' % (n, 1)``, ``'{:>{w}}'.format(...)``) are refused
  outright: a bound would have to know which argument is a width.

* Jinja ships two sources of randomness, the ``lipsum()`` global and the ``random`` filter. A
  template calling either would render another prompt for the verifier than for the operator
  (an honest operator slashed, or nothing checkable): both raise
  :class:`NondeterministicTemplateError` here, on every machine alike.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, ItemsView, Iterable, KeysView, Mapping, ValuesView
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from types import FrameType
from typing import Any

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator, Frame
from jinja2.nodes import Concat
from jinja2.sandbox import ImmutableSandboxedEnvironment

from verinfer.errors import TokenizerError
from verinfer.protocol.jsonsafe import max_depth

__all__ = ["PINNED_NOW", "RenderBudget", "RenderBudgetError", "compile_template",
           "render_template_text"]

# what strftime_now() shows: fixed, so that a prompt is a function of the request alone
PINNED_NOW = datetime(2026, 1, 1, tzinfo=UTC)
MAX_INT = 2**63
MAX_DEPTH = 40  # nested template frames (macros, recursive loops); Python's limit is ~1000 frames
_TEMPLATE_FILE = "<template>"  # co_filename of code compiled by Environment.from_string
_WIDTH = re.compile(r"\d+")
# a width or precision taken from the arguments: `%*d`, `%.*f` (printf style); `{:>{w}}`,
# `{0:{1}}` (str.format style)
_ARG_WIDTH = {"%": re.compile(r"%[^a-zA-Z%]*\*"), "{": re.compile(r"\{[^{}]*\{")}
_current: ContextVar[RenderBudget | None] = ContextVar("verinfer_render_budget", default=None)


class RenderBudgetError(jinja2.exceptions.SecurityError):
    """A render went over one of its :class:`RenderBudget` limits."""


class NondeterministicTemplateError(jinja2.exceptions.SecurityError):
    """The template called something whose result is random (``lipsum``, ``|random``)."""


@dataclass
class RenderBudget:
    """What one render may still spend (see the module docstring); decremented in place."""

    steps: int
    size: int
    work: int

    @classmethod
    def for_inputs(cls, content_chars: int) -> RenderBudget:
        """The budget for messages holding ``content_chars`` characters in all: room for each
        message a few times over plus 1 MiB of the template's own text; a million lines."""
        size = (1 << 20) + 4 * content_chars
        return cls(steps=1_000_000, size=size, work=64 * size)

    def charge(self, work: int) -> None:
        self.work -= work
        if self.work < 0:
            raise RenderBudgetError("the chat template touches too much data")

    def check_size(self, n: int, what: str) -> None:
        if n > self.size:
            raise RenderBudgetError(f"the chat template builds a {what} of {n} elements "
                                    f"(limit {self.size})")


def _budget() -> RenderBudget:
    b = _current.get()
    if b is None:  # a compiled template used outside render_template_text
        raise RenderBudgetError("chat templates render only under a budget")
    return b


def _size(v: Any) -> int:
    return len(v) if isinstance(v, (str, bytes, list, tuple, dict)) else 1


_CONTAINERS = (list, tuple, set, frozenset, KeysView, ValuesView, ItemsView)


def _check_value(b: RenderBudget, v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
        raise RenderBudgetError("the chat template uses an integer beyond 2**63")
    if isinstance(v, (str, bytes)):
        b.check_size(len(v), type(v).__name__)
    elif isinstance(v, (*_CONTAINERS, Mapping, jinja2.utils.Namespace)):
        b.check_size(_printed_size(b, v), "nested value")
    return v


def _printed_size(b: RenderBudget, v: Any) -> int:
    """``len(str(v))`` within a small factor (a repr escapes control characters), counted
    over the value's tree and stopping as soon as it is over the size budget. ``len`` alone
    misses sharing: ``[[a] * 1000] * 1000`` is a list of 1000 items that prints as a million
    copies of ``a``. Each node visited is charged."""
    total, todo = 0, [v]
    while todo:
        x = todo.pop()
        b.charge(1)
        if isinstance(x, (str, bytes)):
            total += len(x) + 4  # quotes, separator
        elif isinstance(x, jinja2.utils.Namespace):
            total += 16
            todo.append(dict(x._Namespace__attrs))
        elif isinstance(x, Mapping):
            total += 2 + 2 * len(x)
            todo.extend(x.keys())
            todo.extend(x.values())
        elif isinstance(x, _CONTAINERS):
            total += 2 + len(x)
            todo.extend(x)
        else:
            total += 24  # an int (<= 2**63), float, bool, None or small object's repr
        if total > b.size:
            break
    return total


def _check_args(b: RenderBudget, args: Iterable[Any]) -> list[Any]:
    args = list(args)
    work = 1
    for a in args:
        _check_value(b, a)
        # an int argument can make a filter loop that often (slice, batch, range)
        work += _size(a) + (min(abs(a), b.size) if isinstance(a, int) else 0)
    b.charge(work)
    return args


def _widths(fmt: str) -> int:
    """The sum of the numbers in a format string (a bound on what its widths can add)."""
    total = 0
    for m in _WIDTH.finditer(fmt):
        if len(m.group()) > 19:
            raise RenderBudgetError("the chat template formats with a huge width")
        total += int(m.group())
    return total


def _refuse_arg_widths(fmt: str, style: str) -> None:
    """A width taken from the arguments is refused: nothing here knows which argument is
    one, so no bound could be put on it before the string is built."""
    plain = fmt.replace("%%", "") if style == "%" else fmt.replace("{{", "").replace("}}", "")
    if _ARG_WIDTH[style].search(plain):
        raise RenderBudgetError("the chat template formats with a width from its arguments")


def _estimate(name: str, value: Any, args: list[Any]) -> int:
    """An upper bound on the size of ``name(value, *args)`` for the str methods and filters
    whose result can be much larger than their inputs (0: no bound needed)."""
    if not isinstance(value, str):
        return 0
    strs = [a for a in args if isinstance(a, str)]
    ints = [a for a in args if isinstance(a, int)]
    n = len(value)
    if name == "replace" and len(strs) >= 2:
        hits = value.count(strs[0]) if strs[0] else n + 1
        return n + hits * len(strs[1])
    if name in ("center", "ljust", "rjust", "zfill", "truncate", "wordwrap"):
        return 2 * n + sum(ints) + sum(map(len, strs))
    if name in ("indent", "expandtabs"):
        per = max([*ints, *map(len, strs), 8])
        return n + (value.count("\n") + value.count("\t") + 1) * per
    if name in ("format", "format_map"):
        return n + _widths(value) + sum(_size(a) for a in args) + sum(
            _size(v) for a in args if isinstance(a, Mapping) for v in a.values())
    return 0


def _count_arg(name: str, args: list[Any], kwargs: Mapping[str, Any]) -> int:
    """How many items ``slice``/``batch`` make: ``slice(n)`` yields n lists whatever its input,
    ``batch(n, fill)`` pads its last list to n items (0 for every other filter)."""
    key = {"slice": "slices", "batch": "linecount"}.get(name)
    if key is None:
        return 0
    n = args[1] if len(args) > 1 else kwargs.get(key)
    return n if isinstance(n, int) else 0


def _join(b: RenderBudget, sep: Any, items: Iterable[Any]) -> list[Any]:
    """The items of a join, materialized and checked so that the joined size is known first."""
    out = []
    total = 0
    for it in items:
        b.charge(1)
        out.append(it)
        total += _size(it) + _size(sep)
        b.check_size(total, "joined string")
    return out


class _BoundedCodegen(CodeGenerator):
    """Compiles ``a ~ b`` to a size-checked concatenation instead of ``str_join``."""

    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, with every size and count bounded."""

    code_generator_class = _BoundedCodegen
    # intercepted operators also stop Jinja folding ``10 ** 10 ** 10`` at compile time
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})
    intercepted_unops = frozenset({"-", "+"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=[jinja2.ext.loopcontrols], finalize=_finalize)
        self.filters["tojson"] = _tojson
        self.filters["random"] = _nondeterministic("the random filter")
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.globals["lipsum"] = _nondeterministic("lipsum()")
        self.globals["raise_exception"] = _raise_exception
        self.globals["namespace"] = TemplateNamespace

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        b = _budget()
        strs = [str(_check_value(b, p)) for p in parts]
        total = sum(map(len, strs))
        b.charge(total)
        b.check_size(total, "string")
        return "".join(strs)

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any,
                   right: Any) -> Any:
        b = _budget()
        _check_args(b, (left, right))
        seq, num = (left, right) if isinstance(right, int) else (right, left)
        if operator == "*" and isinstance(seq, (str, list, tuple)) and isinstance(num, int):
            b.check_size(len(seq) * max(num, 0), type(seq).__name__)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            if left.bit_length() * right > 128 and abs(left) > 1:  # before computing it
                raise RenderBudgetError("the chat template raises to a huge power")
        elif operator == "+" and isinstance(left, (str, list, tuple)):
            b.check_size(_size(left) + _size(right), type(left).__name__)
        elif operator == "%" and isinstance(left, str):
            _refuse_arg_widths(left, "%")
            args = right if isinstance(right, tuple) else (right,)
            b.check_size(len(left) + _widths(left) + sum(map(_size, args)), "string")
        return _check_value(b, super().call_binop(context, operator, left, right))

    def call_unop(self, context: jinja2.runtime.Context, operator: str, arg: Any) -> Any:
        b = _budget()
        _check_args(b, (arg,))
        return _check_value(b, super().call_unop(context, operator, arg))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """Jinja's sandboxed ``str.format``/``format_map``, bounded before it runs."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt, name = value.__self__, value.__name__

        def bounded(*args: Any, **kwargs: Any) -> str:
            b = _budget()
            plain = _check_args(b, [*args, *kwargs.values()])
            b.charge(len(fmt))
            _refuse_arg_widths(fmt, "{")
            b.check_size(_estimate(name, fmt, plain), "string")
            return str(_check_value(b, wrapped(*args, **kwargs)))

        return bounded

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any,
             **kwargs: Any) -> Any:
        b = _budget()
        plain = _check_args(b, [*args, *kwargs.values()])
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str):
            b.charge(len(owner))
            b.check_size(_estimate(name, owner, plain), "string")
            if name == "join" and args:
                args = (_join(b, owner, args[0]), *args[1:])
        return _check_value(b, super().call(__context, __obj, *args, **kwargs))


def _guard_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` with its arguments charged and checked, and its result's size checked; the
    filters that can multiply their input are bounded before they run."""

    @functools.wraps(f)  # keeps jinja_pass_arg (pass_context & co.)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        b = _budget()
        values = [a for a in args if not isinstance(
            a, (jinja2.runtime.Context, jinja2.nodes.EvalContext, jinja2.Environment))]
        plain = _check_args(b, [*values, *kwargs.values()])
        if values:
            if name == "format" and isinstance(values[0], str):  # Jinja's is printf style
                _refuse_arg_widths(values[0], "%")
            b.check_size(_estimate(name, values[0], plain[1:]), "string")
            b.check_size(_count_arg(name, values, kwargs), "list")
        if name == "join" and values:
            sep = kwargs.get("d", values[1] if len(values) > 1 else "")
            args = tuple(_join(b, sep, a) if a is values[0] else a for a in args)
        return _check_value(b, f(*args, **kwargs))

    return guarded


def _finalize(value: Any) -> Any:
    """Every ``{{ … }}`` value, checked before it is printed (a shared-reference list prints
    far larger than its length)."""
    return _check_value(_budget(), value)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _nondeterministic(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NondeterministicTemplateError(f"the chat template calls {what}, whose result is "
                                            "random: a prompt must be a function of the request")

    return refuse


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    if indent is not None or separators is not None:
        # an indent repeats on every line, once per nesting level, and a separator between
        # every two items: bound the size from the compact form before json builds it
        # (``tojson(indent=10**9)``, ``tojson(separators=(' ' * 10**6, ':'))``)
        compact = json.dumps(x, ensure_ascii=ensure_ascii, sort_keys=sort_keys)
        b = _budget()
        b.charge(len(compact))
        width = 0 if indent is None else len(indent) if isinstance(indent, str) \
            else max(int(indent), 0)
        seps = separators if isinstance(separators, (tuple, list)) else ()
        sep = max((len(p) for p in seps if isinstance(p, str)), default=0)
        lines = 1 + sum(compact.count(c) for c in ",[]{}")
        depth = max_depth(compact.encode("utf-8", "surrogatepass"))
        gaps = compact.count(",") + compact.count(":")
        b.check_size(len(compact) + lines * (1 + width * depth) + gaps * sep, "JSON text")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class TemplateNamespace(jinja2.utils.Namespace):
    """transformers' namespace: no underscore-prefixed attributes (CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore-prefixed attributes ({name!r})")


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """The template compiled in a :class:`BoundedSandbox` (cached by source text)."""
    try:
        return BoundedSandbox().from_string(template)
    except RenderBudgetError as e:
        raise TokenizerError(f"the model's chat template does not compile: {e}") from e
    except jinja2.exceptions.TemplateError as e:
        raise TokenizerError(f"the model's chat template does not compile: {e}") from e


def render_template_text(template: str, variables: Mapping[str, Any], *,
                         budget: RenderBudget, now: datetime | None = None) -> str:
    """Render ``template`` with ``variables`` (plus ``strftime_now`` at ``now``, default
    :data:`PINNED_NOW`) within ``budget``. Raises Jinja errors (``RenderBudgetError`` among
    them) and the template's own Python errors unchanged: the caller decides what they mean."""
    compiled = compile_template(template)
    instant = PINNED_NOW if now is None else now

    def strftime_now(fmt: str) -> str:
        return instant.strftime(fmt)

    token = _current.set(budget)
    previous = sys.gettrace()
    sys.settrace(_tracer(budget))
    try:
        out: list[str] = []
        size = 0
        for chunk in compiled.generate({**variables, "strftime_now": strftime_now}):
            size += len(chunk)
            budget.check_size(size, "rendered prompt")
            out.append(chunk)
        return "".join(out)
    finally:
        sys.settrace(previous)
        _current.reset(token)


def _tracer(budget: RenderBudget) -> Callable[[FrameType, str, Any], Any]:
    """A trace hook counting the lines executed in template code (and nothing else), and how
    deeply template frames nest: recursion is cut at :data:`MAX_DEPTH` template frames, a
    count, rather than at Python's recursion limit, which depends on how deep in its own stack
    the caller happened to render (an operator and a verifier would disagree at the margin)."""
    depth = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal depth
        if event == "line":
            budget.steps -= 1
            if budget.steps < 0:
                raise RenderBudgetError("the chat template runs too many steps")
        elif event == "return":  # also on a generator's yield and on an exception leaving
            depth -= 1
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal depth
        if event == "call" and frame.f_code.co_filename == _TEMPLATE_FILE:
            depth += 1  # also on a generator's resume
            if depth > MAX_DEPTH:
                raise RenderBudgetError("the chat template recurses too deeply")
            return local
        return None

    return global_
