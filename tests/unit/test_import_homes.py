"""One import home for each public name (issue 33).

Every public class, function and constant of ``src/verinfer`` has one address: the module that
defines it. Whoever uses it — another module of the package, a test, a bench, a script — imports
it from there, never from a module that merely imported it (a re-export). Shims that re-export
a name hide where it lives, and a name with two addresses drifts into two definitions.

The check parses (``ast``; nothing is imported) every ``.py`` under ``src/verinfer``,
``tests``, ``bench`` and ``scripts``: every ``from verinfer.X import name`` — at module level or
inside a function — and every ``X.name`` read through a module bound by ``import verinfer.X``
or ``from verinfer import X`` must name the module whose top level defines ``name`` (a ``def``,
``class`` or assignment). A module imported as a module is fine from its package; private names
(``_x``) are the module's own business and not checked. And no module declares a re-export:
its ``__all__`` lists only names it defines (or its own submodules).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
ROOT_PACKAGE = "verinfer"
SCANNED = ("src", "tests", "bench", "scripts")
# The declared re-export homes: a package whose ``__init__`` is a public API that users import
# from (its ``__all__``). A name it lists may be imported from it or from its defining module;
# no other module may re-export. Each entry says why.
FACADES: dict[str, str] = {
    "verinfer.client": "the client SDK: users write `from verinfer.client import VerifiedOpenAI`",
}


@dataclass(frozen=True)
class Module:
    defined: frozenset[str]  # names its top level binds by def, class or assignment
    imported: dict[str, tuple[str, str]]  # name it binds by ``from M import n``: (M, n)
    exported: tuple[str, ...] = ()  # its ``__all__``


@dataclass(frozen=True)
class Misimport:
    path: str
    line: int
    name: str
    via: str
    home: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} takes {self.name} from {self.via}; its home is {self.home}"


def module_name(path: Path, src: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(src).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def absolute(node: ast.ImportFrom, module: str | None, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    if module is None:
        return ""  # a relative import outside the package: not ours to resolve
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run at import: the body, and the branches of top-level ``if`` and
    ``try`` (an optional dependency's fallback still defines the name)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out.extend(_top_level(node.body) + _top_level(node.orelse))
        elif isinstance(node, ast.Try):
            out.extend(_top_level(node.body) + _top_level(node.orelse)
                       + _top_level(node.finalbody))
            for handler in node.handlers:
                out.extend(_top_level(handler.body))
    return out


def _targets(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [n for e in node.elts for n in _targets(e)]
    return []


def index_module(source: str, module: str, is_package: bool) -> Module:
    defined: set[str] = set()
    imported: dict[str, tuple[str, str]] = {}
    exported: list[str] = []
    for node in _top_level(ast.parse(source).body):
        if (isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
                and "__all__" in _targets(node.targets[0] if isinstance(node, ast.Assign)
                                          else node.target)
                and isinstance(node.value, ast.List | ast.Tuple)):
            exported += [e.value for e in node.value.elts
                         if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(n for t in node.targets for n in _targets(t))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            defined.update(_targets(node.target))
        elif isinstance(node, ast.ImportFrom):
            target = absolute(node, module, is_package)
            for alias in node.names:
                imported[alias.asname or alias.name] = (target, alias.name)
                if alias.asname == alias.name and target.split(".")[0] == ROOT_PACKAGE:
                    exported.append(alias.name)  # ``import X as X``: the re-export idiom
    return Module(frozenset(defined), imported, tuple(exported))


def index_package(src: Path) -> dict[str, Module]:
    out: dict[str, Module] = {}
    for path in sorted((src / ROOT_PACKAGE).rglob("*.py")):
        module, is_package = module_name(path, src)
        out[module] = index_module(path.read_text(encoding="utf-8"), module, is_package)
    return out


def home_of(modules: dict[str, Module], module: str, name: str) -> str | None:
    """The module that defines ``name`` as seen from ``module``, following re-exports; None
    when it is a submodule or not a name of the package."""
    seen: set[str] = set()
    while module in modules and module not in seen:
        seen.add(module)
        entry = modules[module]
        if name in entry.defined:
            return module
        if name not in entry.imported:
            return None
        module, name = entry.imported[name]
        if f"{module}.{name}" in modules:
            return None  # ``from pkg import submodule``
    return None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def misimports(source: str, path: str, modules: dict[str, Module], module: str | None = None,
               is_package: bool = False, facades: frozenset[str] = frozenset()) -> list[Misimport]:
    """Every import in ``source`` that takes a public name from a module other than its home."""
    tree = ast.parse(source)
    found: list[Misimport] = []
    bound: dict[str, str] = {}  # local name -> verinfer module it is bound to

    def check(line: int, via: str, name: str) -> None:
        if name.startswith("_") or name == "*" or f"{via}.{name}" in modules:
            return
        if via in facades and name in modules[via].exported:
            return
        home = home_of(modules, via, name)
        if home is not None and home != via:
            found.append(Misimport(path, line, name, via, home))
        elif home is None and via in modules and name not in modules[via].imported:
            found.append(Misimport(path, line, name, via, "nowhere: no module defines it"))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = absolute(node, module, is_package)
            if target != ROOT_PACKAGE and not target.startswith(ROOT_PACKAGE + "."):
                continue
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"
                else:
                    check(node.lineno, target, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == ROOT_PACKAGE and alias.asname:
                    bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node.value)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        via = bound.get(head, head if head == ROOT_PACKAGE else None)
        if via is None:
            continue
        via = f"{via}.{rest}" if rest else via
        if via in modules:
            check(node.lineno, via, node.attr)
    return found


def scanned_files() -> list[Path]:
    out: list[Path] = []
    for top in SCANNED:
        out.extend(p for p in sorted((ROOT / top).rglob("*.py"))
                   if "node_modules" not in p.parts and ".venv" not in p.parts)
    return out


def test_every_public_name_is_imported_from_its_home() -> None:
    modules = index_package(SRC)
    assert f"{ROOT_PACKAGE}.protocol.exec_request" in modules
    found: list[Misimport] = []
    for path in scanned_files():
        module, is_package = (module_name(path, SRC) if path.is_relative_to(SRC / ROOT_PACKAGE)
                              else (None, False))
        found += misimports(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)),
                            modules, module, is_package, frozenset(FACADES))
    assert not found, (f"{len(found)} imports take a name from a re-export instead of the module "
                       "that defines it:\n" + "\n".join(map(str, found)))


def reexports(modules: dict[str, Module], facades: frozenset[str] = frozenset()) -> list[str]:
    """``module: name`` for every name a module's ``__all__`` lists, or it imports as
    ``from verinfer... import X as X``, that it does not define."""
    return [f"{module}: {name}" for module, entry in sorted(modules.items())
            if module not in facades for name in entry.exported
            if name not in entry.defined and f"{module}.{name}" not in modules]


def test_no_module_declares_a_reexport() -> None:
    found = reexports(index_package(SRC), frozenset(FACADES))
    assert not found, ("__all__ lists names the module does not define (import them from "
                       "their home instead):\n" + "\n".join(found))


def test_a_declared_reexport_is_caught() -> None:
    modules = {"verinfer.shim": index_module(
        "from verinfer.home import Thing, make\nfrom verinfer.home import X as X\n"
        "from . import sub\ndef own(): ...\n__all__ = ['Thing', 'own', 'sub']\n",
        "verinfer.shim", True),
        "verinfer.shim.sub": index_module("", "verinfer.shim.sub", False)}
    assert reexports(modules) == ["verinfer.shim: X", "verinfer.shim: Thing"]
    assert reexports(modules, frozenset({"verinfer.shim"})) == []
    # a declared facade's names may be imported from it; what it does not list may not
    assert misimports("from verinfer.shim import Thing\n", "t.py", {**SYNTH, **modules},
                      facades=frozenset({"verinfer.shim"})) == []
    assert len(misimports("from verinfer.shim import make\n", "t.py", {**SYNTH, **modules},
                          facades=frozenset({"verinfer.shim"}))) == 1


# A synthetic package: ``home`` defines the names, ``shim`` re-exports them, ``pkg`` (a package)
# re-exports through ``shim``.
SYNTH = {
    "verinfer.home": index_module("X = 1\nclass Thing: ...\ndef make(): ...\n_priv = 2\n",
                                  "verinfer.home", False),
    "verinfer.shim": index_module("from verinfer.home import Thing, make\n"
                                  "from verinfer.home import X as X\nfrom . import home\n"
                                  "def own(): ...\n", "verinfer.shim", False),
    "verinfer.pkg": index_module("from ..shim import Thing\n", "verinfer.pkg", True),
    "verinfer": index_module("", "verinfer", True),
}


@pytest.mark.parametrize("source", [
    "from verinfer.shim import Thing\n",
    "from verinfer.shim import X as Y\n",
    "def f():\n    from verinfer.shim import make\n",  # a lazy import counts
    "from verinfer.pkg import Thing\n",  # a package's re-export, two steps from home
    "from verinfer import shim\nshim.make()\n",  # through a module bound by name
    "import verinfer.shim as s\ns.Thing\n",
    "import verinfer.shim\nverinfer.shim.Thing\n",
])
def test_a_reexported_name_is_caught(source: str) -> None:
    found = misimports(source, "t.py", SYNTH)
    assert len(found) == 1, found
    assert found[0].home == "verinfer.home"


def test_a_name_no_module_defines_is_caught() -> None:
    """What a removed re-export leaves behind: an import of a name that is not there."""
    found = misimports("from verinfer.pkg import make\n", "t.py", SYNTH)
    assert [(m.name, m.home) for m in found] == [("make", "nowhere: no module defines it")]


@pytest.mark.parametrize("source", [
    "from verinfer.home import Thing, X, make\n",
    "from verinfer.shim import own, home\n",  # its own name, and a submodule
    "from verinfer import home\nhome.Thing\nhome.make()\n",
    "import verinfer.home\nverinfer.home.X\n",
    "from verinfer.shim import _priv\n",  # private: the module's own business
    "from os.path import join\nimport json\njson.dumps\n",
])
def test_an_import_from_home_passes(source: str) -> None:
    assert misimports(source, "t.py", SYNTH) == []


def test_a_relative_import_is_resolved() -> None:
    found = misimports("from .shim import make\n", "src/verinfer/other.py", SYNTH,
                       "verinfer.other", False)
    assert [(m.via, m.home) for m in found] == [("verinfer.shim", "verinfer.home")]
