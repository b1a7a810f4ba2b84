from __future__ import annotations

import _posixsubprocess
import inspect
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the engine (torch, the kernels) is imported by the fixtures that need it,
    # so collecting a fast subset (`pytest -m unit`) does not pay for it up front
    from verinfer.engine.engine import Engine
    from verinfer.engine.loader import LoadedModel

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _import_triton_for_its_interpreter() -> None:
    """Imports ``triton.language`` with ``TRITON_INTERPRET=1``, then restores the environment.

    Triton's own library (``tl.sum``, ``tl.max``, ``tl.cdiv``, ...) is ``@triton.jit``'d when
    triton is first imported, as interpreter functions only if the variable is set then; a
    kernel run by the interpreter (tests/unit/test_triton_ops.py) that calls one compiled
    without it fails ("Cannot call @triton.jit'd outside of the scope of a kernel"). Any module
    collected earlier in the same process may import triton first (vLLM does), so the order is
    fixed here, before collection. Nothing in this process runs Triton on a GPU; subprocesses
    inherit the environment as it was."""
    import importlib.util

    if "triton" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


_import_triton_for_its_interpreter()

# Markers say what a test needs (README.md "Tests", docs/testing.md); all are registered in
# pyproject.toml (--strict-markers). The kind comes from the directory: integration/ and e2e/
# tests run real processes and services; slow/ and adversarial/ add the cost and topic markers
# `slow` and `adversarial` (a test or a fixture anywhere may set them too).
DIRECTORY_MARKERS = {
    "unit": "unit",
    "integration": "integration",
    "e2e": "e2e",
    "slow": "slow",
    "adversarial": "adversarial",
}
# Needs that start something or talk over a socket: a test carrying any of them is not `unit`.
PROCESS_NEEDS = ("process", "loopback", "anvil", "forge", "redis", "devnet", "image", "browser",
                 "vllm")
# The other needs, `gemma` and `smollm2`, are local files (real model weights): a test with only
# those may still be `unit` (in-process); it is usually `slow` as well.
# Fixtures of a conftest.py that bring a need with them: (its file under tests/, fixture name).
FIXTURE_NEEDS = {
    ("e2e/conftest.py", "server"): ("process", "loopback"),  # a real `verinfer serve`
}
# The markers (needs, and `slow` for a file over a few seconds) of the files that do not set
# them themselves (pytestmark), by path under tests/. A test in unit/, slow/ or adversarial/
# with none of PROCESS_NEEDS gets `unit`, and the guard below fails it if it starts a process
# or opens a socket; integration/ and e2e/ never get `unit`.
FILE_MARKERS: dict[str, tuple[str, ...]] = {
    # integration/: what each needs (selection by need; the kind comes from the directory)
    "integration/test_bench_smoke.py": ("process", "redis"),
    "integration/test_chain_cli.py": ("anvil", "process"),
    "integration/test_chain_cli_declare.py": ("anvil", "process"),
    "integration/test_chain_flow.py": ("anvil",),
    "integration/test_chain_governance.py": ("anvil",),
    "integration/test_da_outbox_crash.py": ("process",),
    "integration/test_da_redis.py": ("redis", "process", "loopback"),
    "integration/test_enclave_process_per_receipt.py": ("process", "loopback"),
    "integration/test_forge.py": ("forge", "process"),
    "integration/test_game_sim.py": ("anvil",),
    "integration/test_kms_canary.py": ("process", "loopback"),
    "integration/test_kms_chain_oracle.py": ("anvil", "loopback"),
    "integration/test_kms_cluster.py": ("process", "loopback"),
    "integration/test_kms_per_receipt.py": ("process", "loopback"),
    "integration/test_operator_chain.py": ("anvil", "process"),
    "integration/test_operator_claims.py": ("anvil", "loopback"),
    "integration/test_operator_disconnect.py": ("loopback",),
    "integration/test_verifier_audit_stream.py": ("redis", "loopback"),
    "integration/test_verifier_chain.py": ("anvil",),
    "integration/test_verifier_contract_opened.py": ("anvil",),
    # e2e/
    "e2e/test_bench_smoke_optional.py": ("process", "image", "vllm", "gemma", "slow"),
    "e2e/test_cookbook.py": ("devnet", "process", "anvil", "redis", "slow"),
    "e2e/test_devnet_challenges.py": ("devnet", "process", "anvil", "redis", "slow"),
    "e2e/test_devnet_demo.py": ("devnet", "process", "anvil", "redis", "slow"),
    "e2e/test_explorer_browser.py": ("devnet", "browser", "process", "anvil", "redis", "slow"),
    "e2e/test_image.py": ("image", "process", "slow"),
    "e2e/test_operator_crash.py": ("process", "loopback"),
    "e2e/test_operator_load.py": ("process", "loopback"),
    "e2e/test_operator_schema.py": ("process", "loopback"),
    "e2e/test_reproduce.py": ("devnet", "process", "anvil", "redis", "slow"),
    "e2e/test_reproduce_attacks.py": ("devnet", "process", "anvil", "redis", "slow"),
    "e2e/test_request_rule_differential.py": ("process", "loopback"),
    "e2e/test_server_auth.py": ("process", "loopback"),
    "e2e/test_server_logprobs.py": ("process", "loopback"),
    "e2e/test_server_multimodel.py": ("process", "loopback", "smollm2"),
    "e2e/test_server_openai.py": ("process", "loopback"),
    "e2e/test_server_verification.py": ("process", "loopback"),
    "e2e/test_vllm_backend.py": ("vllm", "devnet", "process", "anvil", "gemma", "slow"),
    # adversarial/: those that start processes or servers (the rest are `unit`)
    "adversarial/test_attestation_tdx.py": ("process", "loopback"),
    "adversarial/test_auditor_operator_drip.py": ("loopback",),
    "adversarial/test_chain_rpc_bounds.py": ("loopback",),
    "adversarial/test_da_hostile_backends.py": ("redis", "loopback"),
    "adversarial/test_da_operator_overwrites_blob.py": ("redis", "loopback"),
    "adversarial/test_enclave_process_hostile.py": ("process",),
    "adversarial/test_envelope_cbor_bombs.py": ("process",),
    "adversarial/test_explorer_hostile_sources.py": ("redis", "loopback"),
    "adversarial/test_explorer_rpc_secret.py": ("process", "loopback"),
    "adversarial/test_fake_eigenda_content_length.py": ("loopback",),
    "adversarial/test_fingerprint_coverage.py": ("anvil",),
    "adversarial/test_hostile_services.py": ("loopback",),
    "adversarial/test_http_cl_te_desync.py": ("loopback",),
    "adversarial/test_http_per_client_caps.py": ("loopback",),
    "adversarial/test_kms_decrypt_flood.py": ("loopback",),
    "adversarial/test_kms_foreign_encapsulation.py": ("process", "loopback"),
    "adversarial/test_kms_forwarding_shard.py": ("process", "loopback"),
    "adversarial/test_kms_head_drip.py": ("loopback",),
    "adversarial/test_kms_hostile_json.py": ("loopback",),
    "adversarial/test_kms_log_publish.py": ("anvil", "process", "loopback"),
    "adversarial/test_kms_nonce_flood.py": ("loopback",),
    "adversarial/test_kms_per_receipt_hostile.py": ("process", "loopback"),
    "adversarial/test_kms_refusal_log_flood.py": ("process", "loopback"),
    "adversarial/test_kms_release_log.py": ("process", "loopback"),
    "adversarial/test_kms_repeated_keys.py": ("process", "loopback"),
    "adversarial/test_kms_rpc_secret.py": ("loopback",),
    "adversarial/test_locate_foreign_batch.py": ("redis",),
    "adversarial/test_operator_backpressure.py": ("redis", "process", "loopback"),
    "adversarial/test_operator_da.py": ("loopback",),
    "adversarial/test_operator_forwarded_for.py": ("loopback",),
    "adversarial/test_operator_health_rpc_secret.py": ("loopback",),
    "adversarial/test_operator_identity.py": ("anvil", "process", "loopback"),
    "adversarial/test_operator_json_shape.py": ("process", "loopback"),
    "adversarial/test_operator_key_guessing.py": ("loopback",),
    "adversarial/test_operator_server.py": ("process", "loopback"),
    "adversarial/test_operator_slow_bodies.py": ("loopback",),
    "adversarial/test_operator_token_budget.py": ("loopback",),
    "adversarial/test_operator_tokenizer_flood.py": ("process", "loopback"),
    "adversarial/test_operator_utf16_body.py": ("loopback",),
    "adversarial/test_request_rule.py": ("process", "loopback"),
    "adversarial/test_request_rule_int_digits.py": ("process",),
    "adversarial/test_unapproved_fingerprint.py": ("anvil", "process"),
    "adversarial/test_verifier_node_faults.py": ("anvil", "redis", "loopback"),
    # unit/: the files of tests/unit/ that start a process or open a socket
    "unit/test_cli_tree.py": ("process",),
    "unit/test_container_digest.py": ("loopback",),
    "unit/test_da_eigenda.py": ("loopback",),
    "unit/test_da_outbox.py": ("loopback",),
    "unit/test_deploy_manifests.py": ("process",),
    "unit/test_domain_error_edges.py": ("loopback",),
    "unit/test_enclave_runner.py": ("loopback",),
    "unit/test_engine_backends.py": ("process",),
    "unit/test_engine_exit.py": ("process",),
    "unit/test_explorer_pages.py": ("loopback",),
    "unit/test_image_lock.py": ("process",),
    "unit/test_kernels_decode.py": ("process",),
    "unit/test_kernels_isa.py": ("process",),
    "unit/test_kernels_panels.py": ("process",),
    "unit/test_kms_shard.py": ("loopback",),
    "unit/test_operator_config.py": ("loopback",),
    "unit/test_protocol_jsonsafe.py": ("process",),
    "unit/test_tokenizer.py": ("process",),
    "unit/test_triton_ops.py": ("process", "slow"),
    # slow/: the real models (`slow` from the directory)
    "slow/test_bench_smoke_gemma.py": ("gemma",),
    "slow/test_chat_template_gemma.py": ("gemma",),
    "slow/test_chat_template_smollm2.py": ("smollm2",),
    "slow/test_gemma_correctness.py": ("gemma",),
    "slow/test_smollm2_correctness.py": ("smollm2",),
    "slow/test_tokenizer_bytelevel_parallel.py": ("smollm2",),
    "slow/test_tokenizer_fast_gemma.py": ("gemma",),
    "slow/test_tokenizer_gemma.py": ("gemma",),
    "slow/test_tokenizer_smollm2.py": ("smollm2",),
}
# the `unit` marker is computed, never set by hand: it would hide a need from -m selection
UNIT_DIRECTORIES = ("unit", "slow", "adversarial")
SHARED_REDIS = ("127.0.0.1", 6379)
XDIST_FIRST = {"e2e": 0, "slow": 1, "integration": 2, "adversarial": 3, "unit": 4}
# The longest files of a CI run (--durations at the last landing, 3 workers): started first so
# that none of them is what the other workers wait for at the end.
XDIST_HEAVIEST = ("e2e/test_image.py", "e2e/test_vllm_backend.py",
                  "slow/test_bench_smoke_gemma.py", "integration/test_bench_smoke.py",
                  "e2e/test_devnet_challenges.py", "slow/test_gemma_correctness.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The guard is armed where `unit` selects (`-m "unit and not slow"`, `-m unit`): a test that
    # escapes fails the fast loop, and is then declared out of it.
    guard = "unit" in (config.getoption("markexpr", "") or "")
    for item in items:
        path = Path(str(item.path)).resolve()
        if not path.is_relative_to(TESTS):
            continue  # a file named on the command line from elsewhere: not ours to mark
        rel = path.relative_to(TESTS)
        directory = DIRECTORY_MARKERS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if directory is None:
            raise pytest.UsageError(f"{rel}: tests live in one of {sorted(DIRECTORY_MARKERS)}")
        if directory != "unit":
            item.add_marker(getattr(pytest.mark, directory))
        needs = set(FILE_MARKERS.get(rel.as_posix(), ())) | _fixture_needs(item)
        for need in sorted(needs):
            item.add_marker(getattr(pytest.mark, need))
        own = {m.name for m in item.iter_markers()}
        if "unit" in own:
            raise pytest.UsageError(f"{item.nodeid}: `unit` is computed (tests/conftest.py), "
                                    "not set by hand")
        if directory in UNIT_DIRECTORIES and not own.intersection(PROCESS_NEEDS):
            item.add_marker(pytest.mark.unit)
            item.stash[_UNIT] = guard
    if hasattr(config, "workerinput"):
        # Under pytest-xdist (.ci/run: `-n 3 --dist loadfile --no-loadscope-reorder`; without
        # the last flag xdist sorts files by their number of tests) the controller hands out
        # whole files in this order: the long ones (real processes, the devnet, the image
        # builds, the real Gemma) first, so that no worker starts a ten-minute file at the end.
        items.sort(key=_xdist_rank)


def _fixture_needs(item: pytest.Item) -> set[str]:
    info = getattr(item, "_fixtureinfo", None)
    needs: set[str] = set()
    for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
        where = Path(inspect.getfile(defs[-1].func)).resolve()
        if where.is_relative_to(TESTS):
            needs.update(FIXTURE_NEEDS.get((where.relative_to(TESTS).as_posix(), name), ()))
    return needs


# The standard library runs `uname -p` once (platform.processor(), cached) the first time it is
# asked; the engine's fingerprint asks. Asked here, outside any test, that is not a test's process.
platform.processor()
_UNIT = pytest.StashKey[bool]()
_ESCAPES = pytest.StashKey[list[str]]()


class UnitTestEscaped(BaseException):
    """Raised where a `unit` test starts a process or opens a socket (a BaseException, so an
    `except Exception` in the code under test does not swallow it; the test fails either way)."""


@contextmanager
def _unit_guard(item: pytest.Item) -> Iterator[None]:
    """While a `unit` test (its fixtures included) runs: no new process, no socket bind or
    connect. A test that needs them declares it (FILE_NEEDS / pytestmark: process, loopback…)."""
    escapes = item.stash.setdefault(_ESCAPES, [])

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: object, **kwargs: object) -> Any:
            escapes.append(what)
            raise UnitTestEscaped(
                f"{item.nodeid} is a `unit` test (no processes, no sockets) but {what}: declare "
                "what it needs (tests/conftest.py FILE_MARKERS or pytestmark = pytest.mark.process"
                " / loopback / ...), see docs/testing.md")
        return refused

    patches = [(subprocess.Popen, "_execute_child", "starts a process"),
               (_posixsubprocess, "fork_exec", "starts a process"),
               (os, "fork", "forks"), (os, "forkpty", "forks"),
               (os, "posix_spawn", "spawns a process"), (os, "posix_spawnp", "spawns a process"),
               (os, "system", "runs a shell command"),
               (socket.socket, "bind", "binds a socket"),
               (socket.socket, "connect", "connects a socket"),
               (socket.socket, "connect_ex", "connects a socket")]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, what in patches:
        setattr(obj, name, refuse(what))
    try:
        yield
    finally:
        for obj, name, original in saved:
            setattr(obj, name, original)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if not item.stash.get(_UNIT, False):
        return (yield)
    with _unit_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not item.stash.get(_UNIT, False):
        return (yield)
    with _unit_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    escapes = item.stash.get(_ESCAPES, [])
    if escapes and report.passed and call.when == "call":
        report.outcome = "failed"  # the code under test caught the refusal and went on
        report.longrepr = (f"{item.nodeid} is a `unit` test but {escapes[0]} (caught by the "
                           "code under test); declare its needs (docs/testing.md)")
    return report


def _xdist_rank(item: pytest.Item) -> tuple[int, int]:
    path = Path(str(item.path)).resolve()
    rel = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    heavy = XDIST_HEAVIEST.index(rel) if rel in XDIST_HEAVIEST else len(XDIST_HEAVIEST)
    return heavy, XDIST_FIRST.get(rel.split("/")[0], len(XDIST_FIRST))


def _redis_answers() -> bool:
    try:
        with socket.create_connection(SHARED_REDIS, timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _marker_selected(config: pytest.Config, markers: set[str | None]) -> bool:
    """Whether ``-m`` can select tests that carry ``markers`` (no ``-m``: yes)."""
    expr = config.getoption("markexpr", "") or ""
    if not expr:
        return True
    try:  # pytest's own -m grammar; should it move, err on the side of starting Redis
        from _pytest.mark.expression import Expression

        def matches(name: str, /, **_: str | int | bool | None) -> bool:
            return name in markers

        return Expression.compile(expr).evaluate(matches)
    except (ImportError, pytest.UsageError):
        return True


_redis_ensured = False


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> None:
    """The integration, e2e and adversarial tests (and the devnet) use the shared Redis on
    127.0.0.1:6379: start it (scripts/ensure-redis) before the first such test module is
    imported — their skip conditions probe the server at import — when ``-m`` can select it (by
    the file's directory and FILE_MARKERS) and nothing answers, so the suite does not depend on
    a server someone else started. The unit loop (``-m "unit and not slow"``) never starts it."""
    global _redis_ensured
    if _redis_ensured or not file_path.name.startswith("test_") or file_path.suffix != ".py":
        return
    path = file_path.resolve()
    if not path.is_relative_to(TESTS) or len(path.relative_to(TESTS).parts) < 2:
        return
    rel = path.relative_to(TESTS)
    directory = DIRECTORY_MARKERS.get(rel.parts[0])
    markers: set[str | None] = set(FILE_MARKERS.get(rel.as_posix(), ()))
    if directory is None or (directory == "unit" and not markers.intersection(PROCESS_NEEDS)):
        return  # `unit` tests (computed in pytest_collection_modifyitems) never need it
    if directory != "unit":
        markers.add(directory)
    if not _marker_selected(parent.config, markers):
        return
    _redis_ensured = True
    if not _redis_answers():
        subprocess.run([str(ROOT / "scripts" / "ensure-redis")], check=False, timeout=300)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verinfer.engine.tiny import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_path: Path) -> LoadedModel:
    from verinfer.engine.loader import load_model

    return load_model(tiny_path)


@pytest.fixture(scope="session")
def tiny_engine(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    from verinfer.engine.engine import Engine

    eng = Engine(tiny_loaded, "invariant", max_seqs=16, max_batch_tokens=48)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def tiny_engine_fast(tiny_loaded: LoadedModel) -> Iterator[Engine]:
    from verinfer.engine.engine import Engine

    eng = Engine(tiny_loaded, "fast", max_seqs=16, max_batch_tokens=48)
    yield eng
    eng.close()
