"""The import layers of docs/architecture.md, enforced.

The layer table lives once, in docs/architecture.md (between ``<!-- layers`` and
``<!-- /layers -->``); this test reads it from there, so the document and the check cannot drift.
Every module under src/verinfer is parsed with ``ast`` (nothing is imported or run) and every
``import``/``from ... import`` in it counts — at module level, inside functions and under
``if TYPE_CHECKING:`` alike: a type-only import is still a dependency on the layer above, and
a lazy import is still a cycle, only a later one.

Rule: a module may import modules of a lower layer, and of its own layer only within its own
package ``verinfer.X`` (the packages that share a layer, such as operator and verifier, stay
independent of each other). Two more rules (issue 33): the services carry no devnet code (the
operator and the verifier import neither anvil's helpers nor the test doubles), and no two
modules import each other, directly or around a circle, lazily or not.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"
ROOT_PACKAGE = "verinfer"

# Upward imports that exist today and are known. Each entry is (importer, imported module) with
# why it is still there and where its removal is tracked. The test fails on any upward import
# NOT listed here, and on an entry that no longer occurs (delete it when you fix it, so the list
# only ever shrinks).
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {
    # Empty: the last two (the request rule and ExecRequest.sampling_params reaching up into
    # receipts and the engine) went when ExecRequest and SamplingParams moved into the protocol
    # layer (issue 22). kms and enclave do not import each other: both import the attestation
    # package below them (test_kms_and_enclave_meet_only_in_attestation).
}


@dataclass(frozen=True)
class Violation:
    importer: str
    imported: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}: {self.why}"


def read_layer_table(text: str) -> dict[str, int]:
    """``{module prefix: layer}`` from the table between the layer markers of the document."""
    m = re.search(r"<!-- layers\b.*?-->\n(.*?)<!-- /layers -->", text, re.S)
    if m is None:
        raise AssertionError("docs/architecture.md has no <!-- layers --> table")
    table: dict[str, int] = {}
    for row in m.group(1).splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue  # header and separator rows
        layer = int(cells[0])
        for name in re.findall(r"`([^`]+)`", cells[1]):
            if name in table:
                raise AssertionError(f"{name} is in two layers of the table")
            table[name] = layer
    if not table:
        raise AssertionError("the layer table is empty")
    return table


def layer_of(module: str, table: dict[str, int]) -> tuple[int, str] | None:
    """The layer of ``module``: its longest table entry that is the module or a package above
    it. The root package's entry names only the root module, so an unlisted subpackage is
    unplaced instead of silently landing in the root's layer."""
    best: str | None = None
    for entry in table:
        hit = module == entry or (entry != ROOT_PACKAGE and module.startswith(entry + "."))
        if hit and (best is None or len(entry) > len(best)):
            best = entry
    return None if best is None else (table[best], best)


def package_of(module: str) -> str:
    """``verinfer.X`` (the unit that may import itself within a layer)."""
    return ".".join(module.split(".")[:2])


def imports_of(source: str, module: str, is_package: bool,
               known_modules: set[str]) -> list[tuple[int, str]]:
    """Every ``verinfer`` module ``source`` imports, with its line. ``from pkg import name``
    counts as importing ``pkg.name`` when that is a module (so ``from verinfer.enclave import
    attestation`` is an attestation import, not one of the whole enclave package)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                if node.level - 1 > len(base):
                    raise AssertionError(f"{module}:{node.lineno}: relative import beyond the "
                                         "top package")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((node.lineno, sub if sub in known_modules else target))
    return [(line, name) for line, name in out
            if name == ROOT_PACKAGE or name.startswith(ROOT_PACKAGE + ".")]


def violations(sources: dict[str, tuple[str, bool]], table: dict[str, int],
               known_modules: set[str]) -> list[Violation]:
    """Every import in ``sources`` (``{module: (source, is_package)}``) the table forbids."""
    found: list[Violation] = []
    for module, (source, is_package) in sorted(sources.items()):
        placed = layer_of(module, table)
        if placed is None:
            found.append(Violation(module, module, 0, "module has no layer in the table"))
            continue
        layer, _ = placed
        for line, imported in imports_of(source, module, is_package, known_modules):
            target = layer_of(imported, table)
            if target is None:
                found.append(Violation(module, imported, line, "imported module has no layer"))
            elif target[0] > layer:
                found.append(Violation(module, imported, line,
                                       f"layer {layer} imports layer {target[0]}"))
            elif target[0] == layer and package_of(imported) != package_of(module):
                found.append(Violation(module, imported, line,
                                       f"packages sharing layer {layer} import each other"))
    return found


def repository_sources() -> dict[str, tuple[str, bool]]:
    out: dict[str, tuple[str, bool]] = {}
    for path in sorted((SRC / ROOT_PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path.read_text(encoding="utf-8"), is_package)
    return out


def compiled_modules() -> set[str]:
    """Extension modules (``verinfer._kernels``): importable, no Python source to parse."""
    return {f"{ROOT_PACKAGE}.{p.name.split('.')[0]}" for p in (SRC / ROOT_PACKAGE).glob("*.so")}


@pytest.fixture(scope="module")
def table() -> dict[str, int]:
    return read_layer_table(DOC.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sources() -> dict[str, tuple[str, bool]]:
    return repository_sources()


def test_layers_are_numbered_in_order(table: dict[str, int]) -> None:
    layers = sorted(set(table.values()))
    assert layers == list(range(len(layers))), layers
    assert all(e == ROOT_PACKAGE or e.startswith(ROOT_PACKAGE + ".") for e in table)


def test_no_module_imports_a_higher_layer(table: dict[str, int],
                                          sources: dict[str, tuple[str, bool]]) -> None:
    known = set(sources) | compiled_modules()
    found = violations(sources, table, known)
    seen = {(v.importer, v.imported) for v in found}
    new = [str(v) for v in found if (v.importer, v.imported) not in KNOWN_VIOLATIONS]
    assert not new, ("imports against docs/architecture.md's layers (move the code, or place "
                     "the module in the table):\n" + "\n".join(new))
    stale = sorted(set(KNOWN_VIOLATIONS) - seen)
    assert not stale, f"fixed, delete from KNOWN_VIOLATIONS: {stale}"


# A small table of the same shape as the document's, for the checks on synthetic sources.
SYNTHETIC = """<!-- layers: synthetic -->
| layer | modules | what |
| --- | --- | --- |
| 0 | `verinfer`, `verinfer.errors` | x |
| 1 | `verinfer.protocol` | x |
| 2 | `verinfer.receipts` | x |
| 3 | `verinfer.attestation` | x |
| 4 | `verinfer.kms` | x |
| 5 | `verinfer.enclave` | x |
| 6 | `verinfer.operator`, `verinfer.verifier` | x |
<!-- /layers -->
"""
SYNTH_MODULES = {"verinfer", "verinfer.errors", "verinfer.protocol", "verinfer.protocol.limits",
                 "verinfer.receipts", "verinfer.receipts.canonical", "verinfer.attestation",
                 "verinfer.attestation.quotes", "verinfer.enclave", "verinfer.enclave.runner",
                 "verinfer.kms",
                 "verinfer.kms.shard", "verinfer.operator", "verinfer.operator.app",
                 "verinfer.verifier", "verinfer.verifier.node"}


def _check(module: str, source: str, is_package: bool = False) -> list[Violation]:
    return violations({module: (source, is_package)}, read_layer_table(SYNTHETIC), SYNTH_MODULES)


@pytest.mark.parametrize(("module", "source"), [
    # plain upward import: receipts (2) reaching the operator (6)
    ("verinfer.receipts.canonical", "from verinfer.operator.app import create_app\n"),
    ("verinfer.receipts.canonical", "import verinfer.operator.app\n"),
    # relative, lazy and type-only spellings of the same dependency count the same
    ("verinfer.receipts.canonical", "from ..operator import app\n"),
    ("verinfer.receipts.canonical",
     "def f():\n    from verinfer.operator.app import create_app\n    return create_app\n"),
    ("verinfer.receipts.canonical",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from verinfer.operator.app import create_app\n"),
    # the bottom layer reaching up one step
    ("verinfer.protocol.limits", "from verinfer.receipts import canonical\n"),
    # attestation (3) reaches neither the KMS (4) nor the enclave runner (5); the KMS not the runner
    ("verinfer.attestation.quotes", "from verinfer.enclave import runner\n"),
    ("verinfer.attestation.quotes", "from verinfer.kms.shard import report_data\n"),
    ("verinfer.kms.shard", "from verinfer.enclave.runner import run\n"),
    ("verinfer.kms.shard", "import verinfer.enclave\n"),
    # two services on one layer stay independent
    ("verinfer.operator.app", "from verinfer.verifier.node import Node\n"),
])
def test_upward_import_is_caught(module: str, source: str) -> None:
    found = _check(module, source)
    assert len(found) == 1, found
    assert found[0].importer == module


@pytest.mark.parametrize(("module", "source"), [
    ("verinfer.kms.shard", "from verinfer.attestation.quotes import Quote\n"),
    ("verinfer.kms.shard", "from verinfer.attestation import quotes\n"),
    ("verinfer.enclave.runner", "from verinfer.kms.shard import Shard\nimport verinfer.errors\n"),
    ("verinfer.enclave.runner", "from verinfer.attestation.quotes import Attester\n"),
    ("verinfer.operator.app", "from . import app\nfrom verinfer.operator.app import x\n"),
    ("verinfer.receipts.canonical", "import json\nfrom verinfer import errors\n"),
])
def test_downward_and_own_package_imports_pass(module: str, source: str) -> None:
    assert _check(module, source) == []


def test_unplaced_module_is_reported() -> None:
    found = _check("verinfer.newpart.thing", "")
    assert [v.why for v in found] == ["module has no layer in the table"]
    found = _check("verinfer.receipts.canonical", "from verinfer.newpart import x\n")
    assert [v.why for v in found] == ["imported module has no layer"]


def test_the_repository_stands_alone() -> None:
    """No pointer to a design file outside the repository; every repository path the
    architecture document names in backticks exists."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((SRC / ROOT_PACKAGE).rglob("*.py"))]:
        text = path.read_text(encoding="utf-8")
        assert "DESIGN" not in text and "../shared" not in text, path
    doc = DOC.read_text(encoding="utf-8")
    names = re.findall(r"`((?:src|docs|tests|scripts|bench|contracts|csrc)/[^`*\s:]+)`", doc)
    assert names
    missing = [n for n in names if not (ROOT / n).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


@pytest.mark.parametrize(("module", "source"), [
    # the two upward imports issue 22 removed, put back: the real table must refuse them
    ("verinfer.protocol.request_rule", "from verinfer.receipts.canonical import ExecRequest\n"),
    ("verinfer.protocol.exec_request",
     "def f():\n    from verinfer.engine.sampling import SamplingParams\n"),
    ("verinfer.protocol.sampling_params", "import torch\nfrom verinfer.engine import kernels\n"),
    # kms -> enclave and attestation -> kms, the cycle issue 22 removed, put back
    ("verinfer.kms.shard", "from verinfer.enclave.runner import EnclaveRunner\n"),
    ("verinfer.attestation.quotes",
     "def f():\n    from verinfer.kms.protocol import report_data\n"),
])
def test_the_documents_table_catches_an_upward_import(table: dict[str, int],
                                                      sources: dict[str, tuple[str, bool]],
                                                      module: str, source: str) -> None:
    assert module in sources  # a real module, with an import spliced in
    found = violations({module: (source, False)}, table, set(sources) | compiled_modules())
    assert [v.importer for v in found] == [module], found
    assert "imports layer" in found[0].why


ATTESTATION = f"{ROOT_PACKAGE}.attestation"
KMS = f"{ROOT_PACKAGE}.kms"
ENCLAVE = f"{ROOT_PACKAGE}.enclave"


def _imports_by_package(sources: dict[str, tuple[str, bool]],
                        package: str) -> dict[str, set[str]]:
    """``{module of package: the verinfer modules it imports}``, every spelling counted."""
    known = set(sources) | compiled_modules()
    return {module: {name for _, name in imports_of(source, module, is_package, known)}
            for module, (source, is_package) in sources.items()
            if module == package or module.startswith(package + ".")}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_kms_and_enclave_meet_only_in_attestation(table: dict[str, int],
                                                   sources: dict[str, tuple[str, bool]]) -> None:
    """Issue 22: attestation is its own package below both; the KMS imports nothing of the
    enclave, attestation nothing of either, and the enclave takes its quotes from attestation
    (no attestation module is left behind in the enclave package)."""
    rows: dict[str, int] = {}
    for package in (ATTESTATION, KMS, ENCLAVE):
        placed = layer_of(package, table)
        assert placed is not None and placed[1] == package, f"{package} has no row of its own"
        rows[package] = placed[0]
    assert rows[ATTESTATION] < rows[KMS] < rows[ENCLAVE], rows

    kms = _imports_by_package(sources, KMS)
    assert kms, "no kms modules found"
    kms_to_enclave = sorted(f"{m} -> {i}" for m, names in kms.items() for i in names
                            if _in(i, ENCLAVE))
    assert kms_to_enclave == []
    assert any(_in(i, ATTESTATION) for names in kms.values() for i in names)

    attestation = _imports_by_package(sources, ATTESTATION)
    assert {f"{ATTESTATION}.{m}" for m in ("quotes", "software", "tdx", "tee_gate", "errors")} \
        <= set(attestation)
    upward = sorted(f"{m} -> {i}" for m, names in attestation.items() for i in names
                    if _in(i, KMS) or _in(i, ENCLAVE))
    assert upward == []

    enclave = _imports_by_package(sources, ENCLAVE)
    left_behind = sorted(m for m in enclave
                         if m.rsplit(".", 1)[-1] in {"attestation", "software", "tdx", "tee_gate"})
    assert left_behind == [], "attestation modules still in the enclave package"
    runner_imports = enclave[f"{ENCLAVE}.runner"]
    assert f"{ATTESTATION}.quotes" in runner_imports  # the runner's Attester comes from below


# The services carry no devnet code: anvil's block and clock helpers and the test doubles are
# for the devnet, the tests and the benches (verinfer.testing.chain_clock moves anvil for them).
SERVICE_FORBIDDEN: dict[str, tuple[str, ...]] = {
    f"{ROOT_PACKAGE}.operator": (f"{ROOT_PACKAGE}.chain.anvil", f"{ROOT_PACKAGE}.testing"),
    f"{ROOT_PACKAGE}.verifier": (f"{ROOT_PACKAGE}.chain.anvil", f"{ROOT_PACKAGE}.testing"),
}


def devnet_imports(sources: dict[str, tuple[str, bool]], known: set[str]) -> list[str]:
    """``importer:line -> imported`` for every import SERVICE_FORBIDDEN forbids."""
    found: list[str] = []
    for module, (source, is_package) in sorted(sources.items()):
        for service, banned in SERVICE_FORBIDDEN.items():
            if not _in(module, service):
                continue
            found += [f"{module}:{line} -> {imported}"
                      for line, imported in imports_of(source, module, is_package, known)
                      if any(_in(imported, b) for b in banned)]
    return found


def test_services_import_no_devnet_code(sources: dict[str, tuple[str, bool]]) -> None:
    found = devnet_imports(sources, set(sources) | compiled_modules())
    assert not found, ("the operator and the verifier import devnet helpers (move the behaviour "
                       "to the devnet side, verinfer.testing.chain_clock):\n" + "\n".join(found))


@pytest.mark.parametrize("source", [
    "from verinfer.chain.anvil import mine\n",
    "def f():\n    from verinfer.chain import anvil\n",
    "import verinfer.testing.evidence\n",
])
def test_a_devnet_import_in_a_service_is_caught(source: str) -> None:
    known = {"verinfer.chain", "verinfer.chain.anvil", "verinfer.testing",
             "verinfer.testing.evidence", "verinfer.verifier.node"}
    assert len(devnet_imports({"verinfer.verifier.node": (source, False)}, known)) == 1
    assert devnet_imports({"verinfer.devnet.stack": (source, False)}, known) == []


def import_cycles(sources: dict[str, tuple[str, bool]], known: set[str]) -> list[list[str]]:
    """The import circles among ``sources``: each strongly connected set of two or more modules
    of the import graph (every import counts, lazy and type-only ones too), sorted."""
    graph = {m: sorted({n for _, n in imports_of(s, m, p, known) if n in sources and n != m})
             for m, (s, p) in sources.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):  # Tarjan's algorithm, iteratively (no recursion limit)
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(graph[node]):
                work.append((node, i + 1))
                nxt = graph[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                comp: list[str] = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(cycles)


def test_no_import_cycles(sources: dict[str, tuple[str, bool]]) -> None:
    cycles = import_cycles(sources, set(sources) | compiled_modules())
    assert not cycles, ("modules that import each other (a lazy import is still a circle: move "
                        "the shared part into a module below both):\n"
                        + "\n".join(" <-> ".join(c) for c in cycles))


def test_an_import_cycle_is_caught() -> None:
    known = {"verinfer.a", "verinfer.b", "verinfer.c", "verinfer.d"}
    sources = {
        "verinfer.a": ("from verinfer.b import x\n", False),
        # lazy, and through a third module
        "verinfer.b": ("def f():\n    from verinfer import c\n", False),
        "verinfer.c": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    import verinfer.a\n", False),
        "verinfer.d": ("import verinfer.a\n", False),  # reaches the circle, is not in it
    }
    assert import_cycles(sources, known) == [["verinfer.a", "verinfer.b", "verinfer.c"]]
    sources["verinfer.c"] = ("", False)
    assert import_cycles(sources, known) == []
