"""The explorer in a real browser (Debian's Chromium driven by Playwright) on one `verinfer
devnet up` (which starts the explorer beside anvil, the shards, the operator and 4 verifiers):

- the overview lists the operator;
- a receipt answered through the openai SDK shows "signature ✓" and "in batch ✓" (also with
  JavaScript off) and the exact `verinfer challenge` command;
- while a challenge runs, its page walks through its phases without a reload and ends on the
  verdict;
- after a cheat (a tampered output signed with the operator's key), the slash appears on the
  already-open operator page;
- the search box finds a receipt id, a batch id, an address, both kinds of DA pointer and a
  challenge id; unknown ids give a 404 page, not a traceback;
- the receipts, operators and models lists page and filter (by operator, model name, status);
  a model name typed in the search box lands on that model's receipts;
- no request leaves 127.0.0.1 (every request the browser makes is recorded and anything else is
  aborted).

Skips with a pointer to scripts/ci-extras.d/20-browser when Chromium or Playwright is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from openai import OpenAI

from verinfer.chain.structs import ETHER, ClaimStatus, Status
from verinfer.devnet.harness import Devnet
from verinfer.engine.engine import Engine
from verinfer.explorer.probes import NAME_RETRY_S
from verinfer.explorer.rows import eth
from verinfer.testing.evidence import chat_body
from verinfer.verifier.challenger import Located

VI = [sys.executable, "-m", "verinfer"]
MODEL = "verinfer-tiny-llama-seed0"
CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = "run scripts/ci-extras.d/20-browser (Debian chromium + pinned playwright)"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

try:
    from playwright.sync_api import Playwright, Route, sync_playwright
except ImportError:  # pragma: no cover - depends on the ci-extras script
    sync_playwright = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(
    sync_playwright is None or shutil.which(CHROMIUM) is None,
    reason=f"Chromium or Playwright missing: {INSTALL_HINT}")


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Devnet]:
    d = tmp_path_factory.mktemp("explorer-devnet") / "net"
    up = subprocess.run([*VI, "devnet", "up", "--dir", str(d)], capture_output=True, text=True,
                        timeout=600)  # minutes on a loaded 2-core machine
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        dn = Devnet(d)
        dn.wait_ready()
        yield dn
    finally:
        subprocess.run([*VI, "devnet", "down", "--dir", str(d)], timeout=60)


@pytest.fixture(scope="module")
def explorer(devnet: Devnet) -> str:
    url = devnet.state.get("explorer_url")
    assert url, "devnet up recorded no explorer_url"
    assert httpx.get(url + "/api/status", timeout=5).status_code == 200
    return str(url)


class Browser:
    """One Chromium with a fresh profile; every request it makes is recorded, and any request
    not for 127.0.0.1 is aborted (and still recorded, so the test fails on it)."""

    def __init__(self, pw: Playwright, profile: Path, *, javascript: bool = True) -> None:
        self.requests: list[str] = []
        self.context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            java_script_enabled=javascript, service_workers="block")
        self.context.on("request", lambda req: self.requests.append(req.url))
        self.context.route("**/*", self._route)
        self.page = self.context.pages[0] if self.context.pages else self.context.new_page()

    @staticmethod
    def _route(route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            route.abort("blockedbyclient")

    def foreign(self) -> list[str]:
        return [u for u in self.requests if urlsplit(u).hostname != "127.0.0.1"]


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    assert sync_playwright is not None
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    b = Browser(playwright, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.context.close()
    assert b.requests, "the browser made no request"
    assert b.foreign() == [], f"requests left 127.0.0.1: {b.foreign()[:5]}"


def _wait_api(explorer: str, path: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Until the explorer's index holds ``path`` (the follower polls twice a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(explorer + path, timeout=5)
        if r.status_code == 200:
            return dict(r.json())
        assert time.monotonic() < deadline, f"{path}: {r.status_code} {r.text[:300]}"
        time.sleep(0.25)


@pytest.fixture(scope="module")
def answered(devnet: Devnet, explorer: str) -> dict[str, Any]:
    """One chat answer through the openai SDK, its batch committed and indexed."""
    client = OpenAI(base_url=devnet.operator_url + "/v1", api_key="unused", max_retries=0,
                    timeout=120)
    resp = client.chat.completions.create(
        model=MODEL, max_tokens=6, seed=3,
        messages=[{"role": "user", "content": "explorer: what is a lighthouse?"}])
    v = dict((resp.model_extra or {})["verification"])
    loc = devnet.wait_located(v["receipt_id"])
    assert loc.batch is not None
    api = _wait_api(explorer, f"/api/receipt/{v['receipt_id']}")
    return {"verification": v, "located": loc, "api": api}


def test_overview_lists_the_operator(browser: Browser, explorer: str, devnet: Devnet) -> None:
    page = browser.page
    page.goto(explorer + "/")
    operator = devnet.state["accounts"]["operator"]
    row = page.locator("#operators tbody tr").filter(
        has=page.locator(f'a[href="/operator/{operator}"]'))
    row.wait_for()
    assert "active" in row.inner_text() and "20 ETH" in row.inner_text()
    assert page.locator("#verifiers tbody tr").count() == 4
    # receipts, throughput and challenges over time, each with both axes and its unit
    assert page.locator("svg.chart").count() == 3
    for fig in ("#chart-receipts", "#chart-throughput", "#chart-challenges"):
        svg = page.locator(f"{fig} svg.chart")
        assert svg.locator("line.axis").count() == 2, fig
        assert svg.locator("text.y-label").count() == 1, fig
        assert "UTC" in svg.locator("text.x-tick").last.text_content(), fig
    assert page.locator("#live").inner_text() == "live"  # live.js ran under the CSP


def test_receipt_page_shows_signature_and_inclusion(browser: Browser, explorer: str,
                                                    answered: dict[str, Any],
                                                    devnet: Devnet) -> None:
    v = answered["verification"]
    page = browser.page
    resp = page.goto(f"{explorer}/receipt/{v['receipt_id']}")
    assert resp is not None and resp.status == 200
    assert page.locator("#sig-check").inner_text() == "signature ✓"
    assert page.locator("#batch-check").inner_text() == "in batch ✓"
    assert page.locator("#da-check").inner_text() == "ciphertext available"
    assert v["operator"] in page.content()
    cmd = page.locator("#challenge-command").inner_text()
    assert cmd.startswith(f"verinfer challenge {v['receipt_id']} --rpc-url {devnet.rpc_url} "
                          f"--deployment ")
    assert f"--da-store {devnet.state['da_store']}" in cmd


def test_receipt_page_works_with_javascript_off(playwright: Playwright, explorer: str,
                                                answered: dict[str, Any],
                                                tmp_path: Path) -> None:
    b = Browser(playwright, tmp_path / "profile", javascript=False)
    try:
        b.page.goto(f"{explorer}/receipt/{answered['verification']['receipt_id']}")
        assert b.page.locator("#sig-check").inner_text() == "signature ✓"
        assert b.page.locator("#batch-check").inner_text() == "in batch ✓"
        assert b.page.locator("#live").inner_text() == "static page"  # no script ran
        assert b.foreign() == []
    finally:
        b.context.close()


def _follow(devnet: Devnet, cid: int, out: dict[str, Any]) -> None:
    try:
        out["status"] = devnet.challenger().wait(cid, timeout_s=180, poll_s=0.3)
    except Exception as e:  # surfaced by the test thread
        out["error"] = e


def test_challenge_page_moves_through_phases_without_reload(
        browser: Browser, explorer: str, devnet: Devnet, answered: dict[str, Any]) -> None:
    ch = devnet.challenger()
    kind, cid = ch.open(answered["located"])
    assert kind == "challenge"
    _wait_api(explorer, f"/api/challenge/{cid}")
    page = browser.page
    page.goto(f"{explorer}/challenge/{cid}")
    page.evaluate("window.__explorerProbe = 'same document'")
    result: dict[str, Any] = {}
    follower = threading.Thread(target=_follow, args=(devnet, cid, result))
    follower.start()
    phases: list[str] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        phase = page.evaluate(
            "document.getElementById('timeline') ? "
            "document.getElementById('timeline').dataset.phase : ''")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        if phase == "verdict":
            break
        time.sleep(0.1)
    follower.join(timeout=200)
    print(json.dumps({"challenge": cid, "phases_seen": phases}))
    assert "error" not in result, result
    assert result["status"] is Status.DISMISSED
    order = ["opened", "drawn", "commits", "reveals", "verdict"]
    assert phases and phases[-1] == "verdict", phases
    assert [order.index(p) for p in phases] == sorted(order.index(p) for p in phases), phases
    assert len(phases) >= 2, f"the page showed only {phases}: it never changed live"
    assert page.evaluate("window.__explorerProbe") == "same document"  # never reloaded
    assert "dismissed" in page.locator("#verdict").inner_text()
    assert page.locator("table").first.locator("tbody tr").count() == 4  # the committee


def test_slash_appears_on_operator_page_after_a_cheat(browser: Browser, explorer: str,
                                                      devnet: Devnet) -> None:
    operator = devnet.state["accounts"]["operator"]
    page = browser.page
    page.goto(f"{explorer}/operator/{operator}")
    page.evaluate("window.__explorerProbe = 'operator page'")
    assert page.locator("tr.slash-row").count() == 0
    stake_before = page.locator("#stake").inner_text()  # "20 ETH"
    slash = devnet.read.config.params().slash_amount
    engine = Engine.from_path(Path(devnet.state["model"]))
    try:
        cheat = devnet.unsafe_operator_factory(engine).unsafe_tampered_text(
            chat_body("explorer cheat", max_tokens=6, seed=11))
    finally:
        engine.close()
    devnet.unsafe_publish_as_operator([cheat])
    ch = devnet.challenger()
    _, cid = ch.open(devnet.wait_located("0x" + cheat.digest.hex()))
    assert ch.wait(cid, timeout_s=180, poll_s=0.3) is Status.SLASHED
    row = page.locator("tr.slash-row")
    row.first.wait_for(timeout=30_000)  # appears live, without a reload
    assert page.evaluate("window.__explorerProbe") == "operator page"
    text = row.first.inner_text()
    assert "reexecution" in text and eth(slash) in text and f"challenge {cid}" in text
    left = int(Decimal(stake_before.removesuffix(" ETH")) * ETHER) - slash
    assert page.locator("#stake").inner_text() == eth(left)


def test_light_audits_and_kms_pages(browser: Browser, explorer: str, devnet: Devnet,
                                    answered: dict[str, Any]) -> None:
    """`verinfer audit` over the answered receipt's batch and later ones (the cheat's): the
    audits page shows the on-chain records and the signed reports from the Redis stream; the
    KMS page shows the 5 shards up, the epoch and the accepted TEE."""
    start = answered["located"].batch.block_number
    # anyone with Redis access can write to the stream: junk is counted, never shown as valid
    r = redis.Redis.from_url(devnet.state["redis_url"])
    stream = devnet.state["redis_prefix"] + "audit:reports"
    r.xadd(stream, {"job": "junk", "report": "[" * 100_000})
    r.xadd(stream, {"job": "junk", "report": '{"report": "<script>alert(1)</script>"}'})
    out = subprocess.run(
        [*VI, "audit", "--sample-rate", "1", "--seed", "1", "--from-block", str(start),
         "--rpc-url", devnet.rpc_url, "--deployment", str(devnet.dir / "deployment.json"),
         "--da-store", devnet.state["da_store"], "--redis-url", devnet.state["redis_url"],
         "--prefix", devnet.state["redis_prefix"], "--json", "--timeout-s", "120",
         "--scheduler-key-file", str(Path(devnet.state["kms"]["root"]) / "audit-scheduler.key")],
        capture_output=True, text=True, timeout=200,
        env={**os.environ, "VERINFER_CHAIN_PRIVATE_KEY": devnet.funded_account().key.hex()})
    assert out.returncode == 3, out.stderr[-2000:]  # 3: a mismatch found, not escalated
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["reported"] >= 2 and summary["mismatches"] >= 1, summary
    deadline = time.monotonic() + 30
    while True:
        counts = httpx.get(explorer + "/api/audits", timeout=5).json()["counts"]
        if counts["recorded"] >= summary["reported"] and counts["stream"]["reports"] >= \
                summary["reported"]:
            break
        assert time.monotonic() < deadline, counts
        time.sleep(0.5)
    page = browser.page
    page.goto(explorer + "/audits")
    assert page.locator(f'a[href="/receipt/{answered["verification"]["receipt_id"]}"]').count()
    assert "NO" in page.content()  # the cheat's mismatch
    assert counts["stream"]["malformed"] == 2
    assert "<script>alert" not in page.content()
    assert "✗" not in page.content()  # every stream report's signature checks
    page.goto(explorer + "/kms")
    assert page.locator("text=up").count() == 5
    kms = httpx.get(explorer + "/api/kms", timeout=5).json()
    assert [s["index"] for s in kms["shards"]] == [1, 2, 3, 4, 5]
    assert all(isinstance(s["log_entries"], int) and s["insecure_software_enclave"]
               for s in kms["shards"]), kms["shards"]
    assert [e["epoch"] for e in kms["epochs"]] == [1] and len(kms["accepted_tees"]) == 1
    deadline = time.monotonic() + 15  # the committees' decryptions, from the shards' metrics
    while sum(s["released"] for s in kms["shards"]) < 3:
        assert time.monotonic() < deadline, kms["shards"]
        time.sleep(0.5)
        kms = httpx.get(explorer + "/api/kms", timeout=5).json()


def test_search_finds_each_kind_of_id(browser: Browser, explorer: str, devnet: Devnet,
                                      answered: dict[str, Any]) -> None:
    v = answered["verification"]
    loc = answered["located"]
    batch_id = "0x" + loc.batch.batch_id.hex()
    challenges = _wait_api(explorer, "/api/challenges")["challenges"]
    cid = str(challenges[-1]["id"])
    cases = {
        v["receipt_id"]: f"/receipt/{v['receipt_id']}",
        batch_id: f"/batch/{batch_id}",
        devnet.state["accounts"]["operator"]: f"/operator/{devnet.state['accounts']['operator']}",
        v["da_pointer"]: f"/receipt/{v['receipt_id']}",
        loc.batch.manifest_pointer: f"/batch/{batch_id}",
        cid: f"/challenge/{cid}",
    }
    page = browser.page
    for query, path in cases.items():
        page.goto(explorer + "/")
        box = page.locator("form.search input[name=q]")
        box.fill(query)
        with page.expect_navigation():
            box.press("Enter")
        assert urlsplit(page.url).path == path, (query, page.url)
        assert page.locator("#error").count() == 0, (query, page.content()[:500])


def test_unpublished_claim_is_upheld_on_its_page(browser: Browser, explorer: str,
                                                 devnet: Devnet) -> None:
    """A receipt signed with the operator's key but never published: the claim (chain time
    moved past its publication deadline and the response period) is upheld, and its page and
    the operator's slashes say so."""
    engine = Engine.from_path(Path(devnet.state["model"]))
    try:
        withheld = devnet.unsafe_operator_factory(engine).honest(
            chat_body("explorer withheld", max_tokens=4, seed=12))
    finally:
        engine.close()
    ch = devnet.challenger()
    kind, claim_id = ch.open(Located(withheld.signed, None, None, None))
    assert kind == "claim" and ch.settle_claim(claim_id) is ClaimStatus.SLASHED
    _wait_api(explorer, f"/api/claim/{claim_id}")
    deadline = time.monotonic() + 30
    while httpx.get(f"{explorer}/api/claim/{claim_id}", timeout=5).json()["claim"]["status"] \
            != "upheld":
        assert time.monotonic() < deadline
        time.sleep(0.25)
    page = browser.page
    page.goto(f"{explorer}/claim/{claim_id}")
    assert "upheld" in page.locator("main").inner_text()
    page.goto(f"{explorer}/operator/{devnet.state['accounts']['operator']}")
    row = page.locator("tr.slash-row").filter(has_text="unpublished")
    assert row.count() == 1 and f"claim {claim_id}" in row.inner_text()


def _served_name(devnet: Devnet) -> str:
    """The name the operator serves the devnet's model under, as the operator says it (the
    devnet's state records the --model argument, a path for the tiny model; `verinfer serve`
    names a model file by its own name, e.g. verinfer-tiny-llama-seed0)."""
    models = httpx.get(devnet.operator_url + "/v1/models", timeout=10).json()["data"]
    return str(models[0]["id"])


def _wait_named(explorer: str, name: str, timeout_s: float = NAME_RETRY_S + 60.0
                ) -> dict[str, Any]:
    """Until the explorer learned the model's name (the prober asks the operator endpoint
    every 3 s; an ask that failed, e.g. timed out on a loaded machine, is repeated only after
    NAME_RETRY_S, so waiting less than that turns one slow answer into a failure)."""
    deadline = time.monotonic() + timeout_s
    while True:
        models = httpx.get(explorer + "/api/models", timeout=5).json()["models"]
        hit = [m for m in models if m["model"] == name]
        if hit:
            return dict(hit[0])
        assert time.monotonic() < deadline, models
        time.sleep(0.5)


def test_receipts_list_filters_by_operator_model_and_status(
        browser: Browser, explorer: str, devnet: Devnet, answered: dict[str, Any]) -> None:
    rid = answered["verification"]["receipt_id"]
    operator = devnet.state["accounts"]["operator"]
    name = _served_name(devnet)
    model = _wait_named(explorer, name)
    page = browser.page
    resp = page.goto(explorer + "/receipts")
    assert resp is not None and resp.status == 200
    row = page.locator("#receipts tbody tr").filter(has=page.locator(f'a[href="/receipt/{rid}"]'))
    assert row.count() == 1
    assert name in row.inner_text()  # the model's name, not its 0x hash
    # the filter form, as a person uses it: this operator's receipts in the answered one's
    # status (challengeable, or dismissed once the challenge test ran)
    status = httpx.get(f"{explorer}/api/receipt/{rid}", timeout=5).json()["receipt_status"]
    page.fill("form.filters input[name=operator]", operator)
    page.select_option("form.filters select[name=status]", status)
    with page.expect_navigation():
        page.click("form.filters button[type=submit]")
    q = urlsplit(page.url).query
    assert f"operator={operator}" in q and f"status={status}" in q
    shown = page.locator("#receipts tbody tr a[href^='/receipt/']").evaluate_all(
        "els => els.map(e => e.getAttribute('href'))")
    api = httpx.get(f"{explorer}/api/receipts?operator={operator}&status={status}",
                    timeout=5).json()
    assert f"/receipt/{rid}" in shown
    assert shown == [f"/receipt/{r['receipt']}" for r in api["receipts"]]
    assert all(r["status"] == status for r in api["receipts"])
    # by model name
    page.goto(explorer + "/receipts?model=" + model["model_id"])
    assert name in page.locator("#model-filter").inner_text()
    assert page.locator(f'#receipts a[href="/receipt/{rid}"]').count() == 1
    # a bad filter is a 400 page naming the parameter, not a traceback
    resp = page.goto(explorer + "/receipts?status=bogus")
    assert resp is not None and resp.status == 400 and page.locator("#error").count() == 1
    assert "status" in page.locator("main").inner_text()


def test_receipt_page_shows_reproduce_command_and_challengeable_until(
        browser: Browser, explorer: str, devnet: Devnet, answered: dict[str, Any]) -> None:
    rid = answered["verification"]["receipt_id"]
    page = browser.page
    page.goto(f"{explorer}/receipt/{rid}")
    cmd = page.locator("#reproduce-command").inner_text()
    assert cmd.startswith(f"verinfer reproduce {rid} --model ")
    assert f"--rpc-url {devnet.rpc_url} --deployment " in cmd
    until = page.locator("#challengeable-until").inner_text()
    assert " UTC (" in until and until[:4].isdigit()  # a date, not unix seconds


def test_operators_and_models_lists(browser: Browser, explorer: str, devnet: Devnet,
                                    answered: dict[str, Any]) -> None:
    operator = devnet.state["accounts"]["operator"]
    name = _served_name(devnet)
    _wait_named(explorer, name)
    page = browser.page
    resp = page.goto(explorer + "/operators")
    assert resp is not None and resp.status == 200
    row = page.locator("#operators tbody tr").filter(
        has=page.locator(f'a[href="/operator/{operator}"]'))
    assert row.count() == 1 and name in row.inner_text()
    page.goto(explorer + "/operators?status=below-minimum")
    assert page.locator("#operators").count() == 0
    resp = page.goto(explorer + "/models")
    assert resp is not None and resp.status == 200
    assert page.locator("#models tbody tr").filter(has_text=name).count() == 1
    page.goto(explorer + "/models?status=revoked")
    assert page.locator("#models").count() == 0


def test_search_finds_a_model_by_name(browser: Browser, explorer: str, devnet: Devnet,
                                      answered: dict[str, Any]) -> None:
    name = _served_name(devnet)
    model = _wait_named(explorer, name)
    rid = answered["verification"]["receipt_id"]
    page = browser.page
    for query in (name, name.rsplit("/", 1)[-1].upper()):  # the whole name, or part of it
        page.goto(explorer + "/")
        box = page.locator("form.search input[name=q]")
        box.fill(query)
        with page.expect_navigation():
            box.press("Enter")
        assert urlsplit(page.url).path == "/receipts", (query, page.url)
        assert urlsplit(page.url).query == f"model={model['model_id']}"
        assert page.locator(f'#receipts a[href="/receipt/{rid}"]').count() == 1
    page.goto(explorer + "/search?q=no-such-model-anywhere")
    assert page.locator("#error").count() == 1


@pytest.mark.parametrize("path", ["/receipt/0x" + "ab" * 32, "/batch/0x" + "cd" * 32,
                                  "/challenge/99999", "/operator/0x" + "ef" * 20,
                                  "/search?q=0x" + "12" * 32, "/nowhere"])
def test_unknown_ids_give_a_404_page(browser: Browser, explorer: str, path: str) -> None:
    resp = browser.page.goto(explorer + path)
    assert resp is not None and resp.status == 404
    assert browser.page.locator("#error").count() == 1
    assert "Traceback" not in browser.page.content()
