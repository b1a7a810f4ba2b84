"""The explorer's pages and API over an index folded from synthetic events (no chain): every
receipt field, the server-side signature and Merkle checks, strict ids (400) and unknown ids
(404 pages, not tracebacks), search for each kind of id, the CSP, live-update markers, and a
hostile manifest on a real local DA store that only labels its batch."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account import Account
from fastapi.testclient import TestClient

from verinfer.chain.bindings import BatchRegistryContract
from verinfer.chain.deploy import Deployment
from verinfer.chain.structs import ETHER, Kind, Role, Status
from verinfer.da_client.factory import DARouter
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import ManifestEntry, build_manifest
from verinfer.da_client.pointer import Pointer
from verinfer.errors import VerinferError
from verinfer.explorer.app import CSP, create_app
from verinfer.explorer.follower import ChainFollower
from verinfer.explorer.index import EventMeta, Index
from verinfer.explorer.models import DEPLOYMENT, ModelName, ModelNames
from verinfer.explorer.rows import eth, operator_row, when
from verinfer.explorer.views import Context
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt

CM = "0x" + "cd" * 20
DOMAIN = Domain(31337, CM)
OPERATOR = Account.from_key(b"\x01" * 32)
MODEL_ID = b"\x11" * 32
MODEL_NAME = "Tiny-Test-Model"
MEMBERS = [Account.from_key(bytes([i + 2]) * 32).address for i in range(3)]


def _meta(block: int, tx: bytes = b"") -> EventMeta:
    return EventMeta(block, 1_700_000_000 + block, tx or secrets.token_bytes(32), 0)


def _signed(i: int, da: LocalDAClient) -> tuple[SignedReceipt, Pointer]:
    blob = f"ciphertext {i}".encode()
    ptr = da.put(blob)
    r = Receipt(operator=OPERATOR.address, chain_id=31337, model_id=MODEL_ID,
                engine_fingerprint_hash=b"\x22" * 32, req_hash=i.to_bytes(32, "big"),
                out_hash=b"\x33" * 32, key_epoch=1, ciphertext_hash=ptr.blob_sha256,
                issued_at=1_700_000_000 + i)
    return SignedReceipt.sign(r, DOMAIN, ReceiptSigner(OPERATOR.key)), ptr


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("explorer")
    da = LocalDAClient(tmp / "da")
    idx = Index()
    params = {"publicationDeadline": 600, "minOperatorStake": ETHER, "quorumBps": 6667,
              "challengeBond": ETHER // 10, "commitPeriod": 300, "challengeWindow": 3600}
    idx.apply("ParamsSet", {"params": params}, _meta(0))
    idx.apply("Approved", {"kind": int(Kind.MODEL), "id": MODEL_ID, "since": 1_699_999_000},
              _meta(0))
    idx.apply("Registered", {"account": OPERATOR.address, "role": int(Role.OPERATOR),
                             "amount": 20 * ETHER}, _meta(1))
    for m in MEMBERS:
        idx.apply("Registered", {"account": m, "role": int(Role.VERIFIER), "amount": ETHER},
                  _meta(2))
    entries = [ManifestEntry(*_signed(i, da)) for i in range(5)]
    manifest = build_manifest(entries)
    mptr = str(da.put(manifest.to_bytes()))
    idx.apply("BatchCommitted", {"operator": OPERATOR.address, "root": manifest.root,
                                 "leafCount": 5, "daPointer": mptr}, _meta(3))
    bid = BatchRegistryContract.batch_id(OPERATOR.address, manifest.root)
    # a second batch whose "manifest" is a nesting bomb: the follower must only label it
    bomb = da.put(b"[" * 100_000 + b"]" * 100_000)
    bomb_root = b"\x44" * 32
    idx.apply("BatchCommitted", {"operator": OPERATOR.address, "root": bomb_root,
                                 "leafCount": 1, "daPointer": str(bomb)}, _meta(4))
    dep = Deployment(31337, "0x" + "01" * 20, "0x" + "02" * 20, "0x" + "03" * 20, CM,
                     "0x" + "05" * 20, 0)
    router = DARouter([da])
    follower = ChainFollower.__new__(ChainFollower)  # only its DA side: no chain here
    follower.index, follower.da, follower.domain, follower._retry_at = idx, router, DOMAIN, {}
    follower._read_manifests()
    # a challenge on receipt 2: drawn, committed, revealed, slashed
    target = entries[2].signed
    idx.apply("ChallengeOpened", {"id": 7, "receiptDigest": target.digest,
                                  "operator": OPERATOR.address, "challenger": MEMBERS[0],
                                  "batchId": bid, "bond": ETHER // 10, "targetBlock": 7},
              _meta(5))
    idx.apply("CommitteeDrawn", {"id": 7, "members": MEMBERS, "weights": [ETHER] * 3,
                                 "commitDeadline": 1_700_000_400,
                                 "revealDeadline": 1_700_000_700}, _meta(8))
    for m in MEMBERS:
        idx.apply("VoteCommitted", {"id": 7, "voter": m, "commitment": b"\x55" * 32}, _meta(9))
        idx.apply("VoteRevealed", {"id": 7, "voter": m, "outHash": b"\x66" * 32}, _meta(10))
    resolve_tx = b"\x77" * 32
    idx.apply("OperatorSlashed", {"operator": OPERATOR.address,
                                  "receiptDigest": target.digest, "fault": 0,
                                  "amount": ETHER, "disputeId": 7}, _meta(11, resolve_tx))
    idx.apply("Credited", {"account": MEMBERS[1], "amount": 3 * ETHER // 10},
              _meta(11, resolve_tx))
    idx.apply("ChallengeResolved", {"id": 7, "status": int(Status.SLASHED),
                                    "majorityOutHash": b"\x66" * 32, "slashed": ETHER},
              _meta(11, resolve_tx))
    idx.apply("Slashed", {"account": OPERATOR.address, "amount": ETHER,
                          "newStake": 19 * ETHER}, _meta(11, resolve_tx))
    idx.apply("ClaimOpened", {"id": 3, "receiptDigest": entries[4].signed.digest,
                              "operator": OPERATOR.address, "claimant": MEMBERS[2],
                              "publishBy": 1_700_000_600, "responseDeadline": 1_700_001_200},
              _meta(12))
    idx.head_block = idx.indexed_block = 12
    idx.head_time = 1_700_000_012
    names = ModelNames()
    names.set(MODEL_ID, MODEL_NAME, DEPLOYMENT)
    ctx = Context(idx, DOMAIN, None, router, "http://127.0.0.1:8545", "/d/deployment.json",
                  ("--da-store", "/d/da"), names)
    _ = dep
    return {"client": TestClient(create_app(ctx)), "entries": entries, "batch_id": bid,
            "bomb_id": BatchRegistryContract.batch_id(OPERATOR.address, bomb_root),
            "manifest_pointer": mptr, "index": idx}


def _get(world: dict[str, object], path: str) -> object:
    client = world["client"]
    assert isinstance(client, TestClient)
    return client.get(path, follow_redirects=False)


def test_overview_lists_the_operator_with_stake_and_state(world: dict[str, object]) -> None:
    r = _get(world, "/")
    assert r.status_code == 200
    assert r.headers["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in CSP
    assert OPERATOR.address in r.text and "19 ETH" in r.text and "active" in r.text
    assert "<svg" in r.text and "<script src=\"/static/live.js\"" in r.text
    assert "<script>" not in r.text and "style=" not in r.text  # nothing inline for the CSP
    api = _get(world, "/api/overview").json()
    assert api["operators"][0]["address"] == OPERATOR.address
    assert api["totals"] == {"batches": 2, "receipts": 6, "challenges": 1,
                             "open_challenges": 0, "slashes": 1, "claims": 1,
                             "slashed": "1 ETH"}


def test_receipt_page_shows_every_field_signature_and_inclusion(
        world: dict[str, object]) -> None:
    e = world["entries"][1]  # type: ignore[index]
    rid = "0x" + e.signed.digest.hex()
    r = _get(world, f"/receipt/{rid}")
    assert r.status_code == 200
    assert "signature ✓" in r.text and "in batch ✓" in r.text
    for name in ("version", "operator", "chainId", "modelId", "engineFingerprintHash",
                 "reqHash", "outHash", "keyEpoch", "ciphertextHash", "issuedAt"):
        assert f"<td>{name}</td>" in r.text
    api = _get(world, f"/api/receipt/{rid}").json()
    assert api["signature_ok"] and api["in_batch"] and api["signer"] == OPERATOR.address
    assert api["da_availability"] == "available"
    assert api["challenge_command"] == (f"verinfer challenge {rid} --rpc-url "
                                        "http://127.0.0.1:8545 --deployment "
                                        "/d/deployment.json --da-store /d/da")
    assert api["proof"]["index"] == 1 and api["proof"]["leafCount"] == 5


def test_challenge_page_timeline_committee_and_slash(world: dict[str, object]) -> None:
    r = _get(world, "/challenge/7")
    assert r.status_code == 200 and 'data-phase="verdict"' in r.text
    api = _get(world, "/api/challenge/7").json()
    assert [t["phase"] for t in api["timeline"] if t["done"]] == \
        ["opened", "drawn", "commits", "reveals", "verdict"]
    assert api["challenge"]["status"] == "slashed" and api["slashed"] == "1 ETH"
    assert [m["agrees"] for m in api["committee"]] == [False] * 3
    assert api["committee"][1]["payout"] == "0.3 ETH"
    op = _get(world, f"/api/operator/{OPERATOR.address}").json()
    assert op["slashes"][0]["dispute"] == 7 and op["account"]["stake"] == "19 ETH"
    assert "reexecution" in _get(world, f"/operator/{OPERATOR.address}").text


def test_hostile_manifest_only_labels_its_batch(world: dict[str, object]) -> None:
    bomb = "0x" + world["bomb_id"].hex()  # type: ignore[attr-defined]
    r = _get(world, f"/batch/{bomb}")
    assert r.status_code == 200 and "invalid" in r.text
    assert _get(world, f"/api/batch/{bomb}").json()["batch"]["manifest"] == "invalid"
    good = "0x" + world["batch_id"].hex()  # type: ignore[attr-defined]
    api = _get(world, f"/api/batch/{good}").json()
    assert api["batch"]["manifest"] == "ok" and len(api["receipts"]) == 5
    # the earliest receipt's issuedAt (1_700_000_000) + the publication deadline (600 s)
    assert api["publication_deadline"] == "2023-11-14 22:23:20 UTC" and api["publication_met"]


def test_protocol_parameters_are_shown_in_their_units(world: dict[str, object]) -> None:
    shown = {p["name"]: p["value"] for p in _get(world, "/api/overview").json()["params"]}
    assert shown == {"publication deadline": "600 s", "min operator stake": "1 ETH",
                     "quorum bps": "66.67 %", "challenge bond": "0.1 ETH",
                     "commit period": "300 s", "challenge window": "3600 s"}


@pytest.mark.parametrize("path", [
    "/receipt/0x" + "ab" * 32, "/batch/0x" + "ab" * 32, "/challenge/999", "/claim/999",
    "/operator/0x" + "ab" * 20, "/no/such/page", "/search?q=0x" + "ab" * 32,
    "/search?q=12345", "/search?q=da://local/0x" + "ab" * 32])
def test_unknown_ids_give_a_404_page(world: dict[str, object], path: str) -> None:
    r = _get(world, path)
    assert r.status_code == 404, r.text[:300]
    assert 'id="error"' in r.text and "Traceback" not in r.text
    api = _get(world, "/api" + path if not path.startswith("/search") else
               path.replace("/search", "/api/search"))
    assert api.status_code == 404 and "error" in api.json()


@pytest.mark.parametrize("path", [
    "/receipt/abc", "/receipt/0x" + "ab" * 31, "/receipt/0x" + "zz" * 32, "/challenge/-1",
    "/challenge/1e3", "/challenge/%EF%BC%91", "/operator/0x" + "aB" * 20, "/batch/0X" + "ab" * 32,
    "/search?q=0xhello", "/search?q=" + "n" * 121, "/search?q=da://nowhere/0x00",
    "/receipts?status=bogus", "/receipts?operator=0x12", "/receipts?model=0x1234",
    "/receipts?page=-1", "/receipts?operator=" + "a" * 300, "/models?status=x",
    "/operators?status=x", "/receipts?status=final&status=slashed",
    "/receipts?model=" + "0" * 3000, "/batch/0x" + "ab" * 32 + "?page=x"])
def test_malformed_ids_give_a_400_page(world: dict[str, object], path: str) -> None:
    r = _get(world, path)
    assert r.status_code == 400, (path, r.status_code, r.text[:300])
    assert 'id="error"' in r.text and "Traceback" not in r.text


def test_search_finds_each_kind_of_id(world: dict[str, object]) -> None:
    e = world["entries"][0]  # type: ignore[index]
    rid = "0x" + e.signed.digest.hex()
    bid = "0x" + world["batch_id"].hex()  # type: ignore[attr-defined]
    cases = {rid: f"/receipt/{rid}", bid: f"/batch/{bid}",
             OPERATOR.address.lower(): f"/operator/{OPERATOR.address}",
             str(world["manifest_pointer"]): f"/batch/{bid}",
             str(e.ciphertext): f"/receipt/{rid}", "7": "/challenge/7",
             "claim 3": "/claim/3", f"  {rid.upper().replace('0X', '0x')} ": f"/receipt/{rid}"}
    idx = world["index"]
    assert isinstance(idx, Index)
    cases["0x" + idx.batches[world["batch_id"]].root.hex()] = f"/batch/{bid}"  # type: ignore[index]
    for q, url in cases.items():
        r = _get(world, f"/search?q={q}")
        assert r.status_code == 303 and r.headers["location"] == url, (q, r.text[:200])
        assert _get(world, f"/api/search?q={q}").json()["url"] == url


def test_status_version_moves_when_the_index_changes(world: dict[str, object]) -> None:
    v0 = _get(world, "/api/status").json()["version"]
    idx = world["index"]
    assert isinstance(idx, Index)
    with idx.lock:
        idx.apply("Bonded", {"account": OPERATOR.address, "amount": ETHER,
                             "newStake": 20 * ETHER}, _meta(13))
    v1 = _get(world, "/api/status").json()["version"]
    assert v1 > v0
    # the page carries the version it was rendered at: live.js compares it with /api/status
    assert f'<meta name="vi-live" content="{v1}">' in _get(world, "/").text


def test_static_files_are_vendored() -> None:
    static = Path(__file__).resolve().parents[2] / "src/verinfer/explorer/static"
    js = (static / "live.js").read_text()
    assert "http://" not in js and "https://" not in js
    css = (static / "explorer.css").read_text()
    assert "@import" not in css and "url(" not in css


def test_claim_and_challenger_pages(world: dict[str, object]) -> None:
    claim = _get(world, "/api/claim/3").json()["claim"]
    assert claim["status"] == "open" and claim["claimant"] == MEMBERS[2]
    page = _get(world, f"/operator/{MEMBERS[0]}").text
    assert "Challenges it opened" in page and 'href="/challenge/7"' in page


def test_slash_releases_the_locked_liability() -> None:
    idx = Index()
    who = OPERATOR.address
    idx.apply("Registered", {"account": who, "role": int(Role.OPERATOR), "amount": 5 * ETHER},
              _meta(1))
    idx.apply("Locked", {"account": who, "amount": ETHER, "totalLocked": 2 * ETHER}, _meta(2))
    idx.apply("Slashed", {"account": who, "amount": ETHER, "newStake": 4 * ETHER}, _meta(3))
    assert (idx.accounts[who].stake, idx.accounts[who].locked) == (4 * ETHER, ETHER)
    assert [p.what for p in idx.accounts[who].history] == ["registered", f"slashed {ETHER}"]


def _client(idx: Index, da: LocalDAClient | None = None) -> TestClient:
    ctx = Context(idx, DOMAIN, None, DARouter([da]) if da else None, "http://127.0.0.1:8545",
                  "deployment.json")
    return TestClient(create_app(ctx))


def test_another_operators_batch_cannot_shadow_a_receipt(tmp_path: Path) -> None:
    """Mallory commits a batch holding the victim operator's receipt before the victim does:
    the contract would not accept that batch as the receipt's (it looks batches up under the
    receipt's operator), so neither does the explorer."""
    da = LocalDAClient(tmp_path / "da")
    signed, ptr = _signed(100, da)
    m = build_manifest([ManifestEntry(signed, ptr)])
    mptr = str(da.put(m.to_bytes()))
    mallory = Account.from_key(b"\x09" * 32).address
    idx = Index()
    for block, who in ((1, mallory), (2, OPERATOR.address)):
        idx.apply("BatchCommitted", {"operator": who, "root": m.root, "leafCount": 1,
                                     "daPointer": mptr}, _meta(block))
        idx.add_manifest(BatchRegistryContract.batch_id(who, m.root), m)
    mine = BatchRegistryContract.batch_id(OPERATOR.address, m.root)
    assert idx.receipts[signed.digest].batch_id == mine
    theirs = idx.batches[BatchRegistryContract.batch_id(mallory, m.root)]
    assert "another operator" in theirs.manifest_error
    api = _client(idx, da).get(f"/api/receipt/0x{signed.digest.hex()}").json()
    assert api["in_batch"] and api["batch"]["batch_id"] == "0x" + mine.hex()


def test_a_manifest_with_another_leaf_count_is_invalid(tmp_path: Path) -> None:
    da = LocalDAClient(tmp_path / "da")
    m = build_manifest([ManifestEntry(*_signed(i, da)) for i in range(2)])
    idx = Index()
    idx.apply("BatchCommitted", {"operator": OPERATOR.address, "root": m.root, "leafCount": 3,
                                 "daPointer": "da://local/0x" + "00" * 32}, _meta(1))
    bid = BatchRegistryContract.batch_id(OPERATOR.address, m.root)
    idx.add_manifest(bid, m)
    assert idx.batches[bid].manifest == "invalid" and not idx.receipts


def test_hostile_strings_from_chain_and_da_are_escaped() -> None:
    idx = Index()
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    idx.apply("BatchCommitted", {"operator": OPERATOR.address, "root": b"\x01" * 32,
                                 "leafCount": 1, "daPointer": evil}, _meta(1))
    bid = BatchRegistryContract.batch_id(OPERATOR.address, b"\x01" * 32)
    idx.manifest_failed(bid, "invalid", "manifest said " + evil)
    client = _client(idx)
    for path in (f"/batch/0x{bid.hex()}", "/", "/batches"):
        text = client.get(path).text
        assert "<script>alert" not in text and "<img src=x" not in text, path
    assert "&lt;script&gt;alert(1)" in client.get(f"/batch/0x{bid.hex()}").text


def test_an_unreachable_chain_is_shown_not_fatal() -> None:
    """The follower keeps running (and the pages keep serving the index) while the RPC is
    down; every page's footer says so."""
    import threading

    from web3 import Web3

    from verinfer.ports import free_port

    dep = Deployment(31337, "0x" + "01" * 20, "0x" + "02" * 20, "0x" + "03" * 20, CM,
                     "0x" + "05" * 20, 0)
    idx = Index()
    w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{free_port()}",
                                request_kwargs={"timeout": 2}))
    follower = ChainFollower(idx, w3, dep, None)
    stop = threading.Event()
    t = threading.Thread(target=follower.run, args=(stop, 0.1), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not idx.follower_error and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(timeout=10)
    assert not t.is_alive() and "Connection" in idx.follower_error
    page = _client(idx).get("/").text
    assert 'id="follower-error"' in page and "chain unreachable" in page


def test_probes_bound_what_an_endpoint_sends() -> None:
    """A hostile shard or operator endpoint (an in-process transport standing in for it)
    answering without end, with a nesting bomb or with junk is a status line, not an
    exception or a process holding gigabytes."""
    import httpx

    from verinfer.explorer.probes import MAX_PROBE_BYTES, probe_endpoint, probe_shard

    sent = {"bytes": 0}

    def endless() -> Iterator[bytes]:
        while True:
            sent["bytes"] += 65536
            yield b"[" * 65536

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, content=endless())
        if request.url.path == "/health":
            return httpx.Response(200, content=b"[" * 5000 + b"]" * 5000)
        return httpx.Response(200, content=b"\xff junk")

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        ep = probe_endpoint(client, "http://op")
        shard = probe_shard(client, "http://shard")
    assert not ep.ok and "longer than" in ep.error
    assert sent["bytes"] <= MAX_PROBE_BYTES + 2 * 65536
    assert not shard.ok and shard.error


# ---- the lists, model names, charts, verifier rates (issue 38) ---------------------------------
def test_receipts_list_pages_and_filters(world: dict[str, object]) -> None:
    entries = world["entries"]  # type: ignore[assignment]
    r = _get(world, "/receipts")
    assert r.status_code == 200 and 'id="receipts"' in r.text
    assert MODEL_NAME in r.text  # the name, not only the 0x hash
    api = _get(world, "/api/receipts").json()
    assert api["paging"] == {"page": 1, "pages": 1, "total": 5}
    # newest first; the challenged-and-slashed receipt says so
    assert [x["receipt"] for x in api["receipts"]] == \
        ["0x" + e.signed.digest.hex() for e in reversed(entries)]  # type: ignore[arg-type]
    by_id = {x["receipt"]: x for x in api["receipts"]}
    slashed = "0x" + entries[2].signed.digest.hex()  # type: ignore[index]
    assert by_id[slashed]["status"] == "slashed"
    assert by_id[slashed]["challengeable_until"] == "2023-11-14 23:13:23 UTC"  # batch + 3600 s
    only = _get(world, "/api/receipts?status=slashed").json()["receipts"]
    assert [x["receipt"] for x in only] == [slashed]
    assert _get(world, "/api/receipts?status=challengeable").json()["paging"]["total"] == 4
    assert _get(world, f"/api/receipts?operator={OPERATOR.address}").json()["paging"][
        "total"] == 5
    assert _get(world, f"/api/receipts?operator={MEMBERS[0]}").json()["receipts"] == []
    for model in (MODEL_NAME, MODEL_NAME.lower(), "0x" + MODEL_ID.hex()):
        got = _get(world, f"/api/receipts?model={model}").json()
        assert got["paging"]["total"] == 5 and got["filters"]["model_name"] == MODEL_NAME
    assert _get(world, "/api/receipts?model=no-such-model").status_code == 404
    assert _get(world, "/api/receipts?model=0x" + "99" * 32).json()["receipts"] == []
    # a page past the end is the last page; the pager keeps the filters
    assert _get(world, "/api/receipts?page=99").json()["paging"]["page"] == 1
    r = _get(world, f"/receipts?operator={OPERATOR.address}&status=slashed")
    assert f'value="{OPERATOR.address}"' in r.text and '<option value="slashed" selected>' \
        in r.text


def test_receipts_list_pages_newest_first(tmp_path: Path) -> None:
    """250 receipts in 3 batches: 100 a page, page 3 holds the oldest 50, the pager links
    keep the filter."""
    da = LocalDAClient(tmp_path / "da")
    idx = Index()
    idx.apply("Registered", {"account": OPERATOR.address, "role": int(Role.OPERATOR),
                             "amount": 20 * ETHER}, _meta(1))
    digests = []
    for b in range(3):
        entries = [ManifestEntry(*_signed(1000 * b + i, da)) for i in range(100 if b < 2 else 50)]
        m = build_manifest(entries)
        idx.apply("BatchCommitted", {"operator": OPERATOR.address, "root": m.root,
                                     "leafCount": m.leaf_count,
                                     "daPointer": str(da.put(m.to_bytes()))}, _meta(2 + b))
        idx.add_manifest(BatchRegistryContract.batch_id(OPERATOR.address, m.root), m)
        digests += [e.signed.digest for e in entries]
    client = _client(idx, da)
    p1 = client.get(f"/api/receipts?operator={OPERATOR.address}").json()
    assert p1["paging"] == {"page": 1, "pages": 3, "total": 250}
    assert p1["receipts"][0]["receipt"] == "0x" + digests[-1].hex()
    p3 = client.get(f"/api/receipts?operator={OPERATOR.address}&page=3").json()
    assert [x["receipt"] for x in p3["receipts"]] == ["0x" + d.hex() for d in
                                                      reversed(digests[:50])]
    html = client.get(f"/receipts?operator={OPERATOR.address}&page=2").text
    assert f"/receipts?operator={OPERATOR.address}&amp;model=&amp;status=&amp;page=3" in html


def test_operators_and_models_lists(world: dict[str, object]) -> None:
    r = _get(world, "/operators")
    assert r.status_code == 200 and OPERATOR.address in r.text and MODEL_NAME in r.text
    ops = _get(world, "/api/operators").json()
    assert [o["address"] for o in ops["operators"]] == [OPERATOR.address]
    assert ops["operators"][0]["models"][0]["model"] == MODEL_NAME
    assert _get(world, "/api/operators?status=active").json()["paging"]["total"] == 1
    assert _get(world, "/api/operators?status=below-minimum").json()["operators"] == []
    assert _get(world, f"/api/operators?model={MODEL_NAME}").json()["paging"]["total"] == 1
    r = _get(world, "/models")
    assert r.status_code == 200 and MODEL_NAME in r.text
    models = _get(world, "/api/models").json()["models"]
    assert models == [{"model_id": "0x" + MODEL_ID.hex(), "model": MODEL_NAME,
                       "model_source": DEPLOYMENT, "status": "approved",
                       "approved_since": "2023-11-14 21:56:40 UTC", "revoked": "",
                       "receipts": 5, "operators": 1, "challenges": 1}]
    assert _get(world, "/api/models?q=tiny").json()["paging"]["total"] == 1
    assert _get(world, "/api/models?q=gemma").json()["models"] == []
    assert _get(world, f"/api/models?operator={MEMBERS[0]}").json()["models"] == []
    # the operator page names its approved model
    assert MODEL_NAME in _get(world, f"/operator/{OPERATOR.address}").text


@pytest.mark.parametrize("query", [MODEL_NAME, "tiny-test", "  TINY-TEST-MODEL "])
def test_search_finds_a_model_by_name(world: dict[str, object], query: str) -> None:
    r = _get(world, f"/search?q={query}")
    assert r.status_code == 303, r.text[:300]
    assert r.headers["location"] == f"/receipts?model=0x{MODEL_ID.hex()}"
    assert _get(world, f"/api/search?q={query}").json()["kind"] == "model"
    page = _get(world, r.headers["location"])
    assert page.status_code == 200 and 'id="model-filter"' in page.text


def test_search_for_an_unknown_model_name_is_a_404(world: dict[str, object]) -> None:
    r = _get(world, "/search?q=llama-70b")
    assert r.status_code == 404 and 'id="error"' in r.text


def test_receipt_page_shows_reproduce_command_and_challengeable_until(
        world: dict[str, object]) -> None:
    e = world["entries"][1]  # type: ignore[index]
    rid = "0x" + e.signed.digest.hex()
    api = _get(world, f"/api/receipt/{rid}").json()
    assert api["reproduce_command"] == (
        f"verinfer reproduce {rid} --model {MODEL_NAME} --app-key APP_KEY_FILE --rpc-url "
        "http://127.0.0.1:8545 --deployment /d/deployment.json --da-store /d/da")
    # batch committed at block 3 (time 1_700_000_003) + the 3600 s challenge window
    assert api["challengeable_until"] == "2023-11-14 23:13:23 UTC" and api["challengeable_now"]
    assert api["model"] == MODEL_NAME and api["receipt_status"] == "challengeable"
    html = _get(world, f"/receipt/{rid}").text
    assert 'id="reproduce-command"' in html and "2023-11-14 23:13:23 UTC (open" in html


def test_charts_have_axes_and_units(world: dict[str, object]) -> None:
    charts = _get(world, "/api/overview").json()["charts"]
    assert set(charts) == {"receipts_over_time", "throughput", "challenges_over_time"}
    for svg in charts.values():
        assert svg.count('class="axis"') == 2  # x and y
        assert 'class="note y-label"' in svg and 'class="note y-tick"' in svg
        assert "UTC</text>" in svg  # time labels under the x axis
        assert svg.count("<rect") == 24  # a series of 24 buckets, never a lone bar
    assert "receipts per " in charts["receipts_over_time"]
    assert "receipts / min" in charts["throughput"]
    # the stake chart's axis is in ETH, the unit of the stake shown beside it
    stake = _get(world, f"/api/operator/{OPERATOR.address}").json()["stake_chart"]
    assert ">20 ETH</text>" in stake and "20000" not in stake


def test_verifier_liveness_and_reveal_rates() -> None:
    """Two challenges drawn to the same 3 members, both past their deadlines: member 0 commits
    and reveals in both, member 1 never reveals the second, member 2 sits out the second."""
    idx = Index()
    for m in MEMBERS:
        idx.apply("Registered", {"account": m, "role": int(Role.VERIFIER), "amount": ETHER},
                  _meta(1))
    for cid in (1, 2):
        idx.apply("ChallengeOpened", {"id": cid, "receiptDigest": bytes([cid]) * 32,
                                      "operator": OPERATOR.address, "challenger": MEMBERS[0],
                                      "batchId": b"\x01" * 32, "bond": 1, "targetBlock": 3},
                  _meta(2))
        idx.apply("CommitteeDrawn", {"id": cid, "members": MEMBERS, "weights": [ETHER] * 3,
                                     "commitDeadline": 1_700_000_100,
                                     "revealDeadline": 1_700_000_200}, _meta(3))
        for k, m in enumerate(MEMBERS):
            if cid == 1 or k < 2:
                idx.apply("VoteCommitted", {"id": cid, "voter": m,
                                            "commitment": b"\x55" * 32}, _meta(4))
            if cid == 1 or k == 0:
                idx.apply("VoteRevealed", {"id": cid, "voter": m, "outHash": b"\x66" * 32},
                          _meta(5))
    idx.head_time = 1_700_000_300
    client = _client(idx)
    rows = {v["address"]: v for v in client.get("/api/overview").json()["verifiers"]}
    assert [(rows[m]["liveness"], rows[m]["reveal_rate"]) for m in MEMBERS] == [
        ("2/2 (100 %)", "2/2 (100 %)"), ("2/2 (100 %)", "1/2 (50 %)"),
        ("1/2 (50 %)", "1/2 (50 %)")]
    page = client.get(f"/operator/{MEMBERS[2]}").text
    assert "1/2 (50 %)" in page and 'id="reveal-rate"' in page
    # a seat still inside its phases counts for neither rate yet
    idx.head_time = 1_700_000_050
    rows = {v["address"]: v for v in client.get("/api/overview").json()["verifiers"]}
    assert rows[MEMBERS[2]]["liveness"] == "1/1 (100 %)"


def test_model_names_deployment_list_wins_over_an_endpoint(tmp_path: Path) -> None:
    names = ModelNames()
    path = tmp_path / "models.json"
    path.write_text('{"gemma3-270m": "0x' + "ab" * 32 + '"}')
    assert names.load_file(path) == 1
    assert not names.set(b"\xab" * 32, "evil-name", "per operator endpoint http://x")
    assert names.get(b"\xab" * 32).name == "gemma3-270m"  # type: ignore[union-attr]
    assert not names.set(b"\xcd" * 32, "x" * 500, "per operator endpoint http://x")
    assert not names.set(b"\xcd" * 32, "bad\nname", "per operator endpoint http://x")
    path.write_text('{"bad\\u0000": "0x' + "ab" * 32 + '"}')
    with pytest.raises(VerinferError):
        ModelNames().load_file(path)


def test_model_names_learned_from_an_endpoint_only_for_approved_ids() -> None:
    """The prober asks an operator endpoint (an in-process transport standing in for a hostile
    one) the name of each approved model id only; an id the deployment's list names is not
    asked, an over-long name is dropped, and an id is not asked again before NAME_RETRY_S."""
    import httpx

    from verinfer.explorer.probes import EndpointStatus, Prober

    approved, listed, long_named = b"\x01" * 32, b"\x02" * 32, b"\x04" * 32
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == f"/v1/models/0x{approved.hex()}":
            return httpx.Response(200, json={"id": "served-name", "object": "model"})
        if request.url.path == f"/v1/models/0x{listed.hex()}":
            return httpx.Response(200, json={"id": "operator-says-so"})
        return httpx.Response(200, json={"id": "x" * 10_000})

    names = ModelNames()
    names.set(listed, "from-the-list", DEPLOYMENT)
    prober = Prober([], ["http://op"], None, names=names,
                    model_ids=lambda: [approved, listed, long_named])
    up = [EndpointStatus("http://op", ok=True)]
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert prober.name_models(client, up)
        assert not prober.name_models(client, up)  # nothing asked again yet
        assert not prober.name_models(client, [EndpointStatus("http://op", ok=False)])
    got = names.get(approved)
    assert got is not None and got.name == "served-name"
    assert got.source == "per operator endpoint http://op"
    assert names.get(listed) == ModelName("from-the-list", DEPLOYMENT)
    assert names.get(long_named) is None  # its answer was 10,000 characters
    assert sorted(asked) == sorted(f"/v1/models/0x{m.hex()}" for m in (approved, long_named))


def test_a_pending_raise_of_the_operator_minimum_does_not_show_an_operator_inactive() -> None:
    """Governance raises the configured minimum (ParamsSet) above an honest operator's stake:
    the StakeRegistry keeps the old minimum in force for its notice (MinimumRaisePending), so
    the operator is still active and is shown by when it must bond; once ParamsSynced applies
    the raise, it is below the minimum."""
    idx = Index()
    op = "0x" + "ab" * 20
    idx.apply("ParamsSet", {"params": {"minOperatorStake": ETHER}}, _meta(0))
    idx.apply("ParamsSynced", {"minOperatorStake": ETHER}, _meta(0))
    idx.apply("Registered", {"account": op, "role": int(Role.OPERATOR), "amount": 2 * ETHER},
              _meta(1))
    idx.apply("ParamsSet", {"params": {"minOperatorStake": 5 * ETHER}}, _meta(2))
    due = _meta(2).time + 7200
    idx.apply("MinimumRaisePending", {"role": int(Role.OPERATOR), "current": ETHER,
                                      "pending": 5 * ETHER, "effectiveAt": due}, _meta(2))
    idx.apply("ParamsSynced", {"minOperatorStake": ETHER}, _meta(2))
    row = operator_row(idx, idx.accounts[op])
    assert row["state"] == "active"
    assert row["pending_minimum"] == eth(5 * ETHER)
    assert row["pending_minimum_from"] == when(due)
    idx.apply("ParamsSynced", {"minOperatorStake": 5 * ETHER}, _meta(7300))
    row = operator_row(idx, idx.accounts[op])
    assert row["state"] == "below minimum stake" and "pending_minimum" not in row
