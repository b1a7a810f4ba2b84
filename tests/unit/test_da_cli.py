"""`verinfer da` sub-commands, through the main CLI app."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from verinfer.cli import app
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.outbox import Outbox
from verinfer.receipts.merkle import MerkleProof, verify_proof
from verinfer.testing.sample import sample_entry

runner = CliRunner()


def test_put_get_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "blob.bin"
    src.write_bytes(b"\x00\x01ciphertext\xff")
    store = str(tmp_path / "da")
    r = runner.invoke(app, ["da", "put", str(src), "--store", store])
    assert r.exit_code == 0, r.output
    pointer = r.stdout.strip()
    assert pointer.startswith("da://local/0x")
    out = tmp_path / "out.bin"
    r = runner.invoke(app, ["da", "get", pointer, "--store", store, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == src.read_bytes()
    r = runner.invoke(app, ["da", "get", pointer, "--store", store])
    assert r.exit_code == 0 and r.stdout_bytes == src.read_bytes()


def test_get_errors_are_typed(tmp_path: Path) -> None:
    store = tmp_path / "da"
    r = runner.invoke(app, ["da", "get", "da://local/0x1234", "--store", str(store)])
    assert r.exit_code == 2 and "sha256 (32 bytes), got 2 bytes" in r.output
    p = LocalDAClient(store).put(b"abc")
    with sqlite3.connect(store / "blobs.sqlite") as db:  # corrupt the stored bytes
        db.execute("UPDATE blobs SET data = ?", (b"abd",))
    r = runner.invoke(app, ["da", "get", str(p), "--store", str(store)])
    assert r.exit_code == 1 and "expected sha256" in r.output
    r = runner.invoke(app, ["da", "get", str(p).replace("local", "redis")])
    assert r.exit_code == 2 and "not configured" in r.output


def test_status_publish_and_proof(tmp_path: Path) -> None:
    db, store, sink = tmp_path / "o.db", tmp_path / "da", tmp_path / "batches.jsonl"
    r = runner.invoke(app, ["da", "status", "--db", str(db)])
    assert r.exit_code == 2 and "no outbox" in r.output
    entries = [sample_entry(b"payload %d" % i) for i in range(5)]
    with Outbox(db) as ob:
        ob.enqueue_many(entries)
    r = runner.invoke(app, ["da", "status", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    st = json.loads(r.stdout)
    assert st["entries"]["queued"] == 5 and st["last_batch"] is None
    assert st["oldest_unpublished_age_s"] >= 0
    r = runner.invoke(app, ["da", "publish", "--db", str(db), "--store", str(store),
                            "--sink-file", str(sink), "--batch-max-entries", "4"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in sink.read_text().splitlines()]
    assert [x["leafCount"] for x in lines] == [4, 1]
    r = runner.invoke(app, ["da", "status", "--db", str(db)])
    assert "committed=5" in r.stdout and f"#2 root {lines[1]['batchRoot']}" in r.stdout
    digest = entries[2][0]
    r = runner.invoke(app, ["da", "proof", lines[0]["manifest"], "0x" + digest.hex(),
                            "--store", str(store)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    proof = MerkleProof(out["proof"]["index"],
                        tuple(bytes.fromhex(s[2:]) for s in out["proof"]["siblings"]),
                        out["proof"]["leafCount"])
    assert verify_proof(digest, proof, bytes.fromhex(lines[0]["batchRoot"][2:]))


def test_check_reports_availability(tmp_path: Path) -> None:
    store = tmp_path / "da"
    da = LocalDAClient(store)
    good = da.put(b"kept")
    missing = str(good).replace(good.commitment.hex(), "00" * 32)
    r = runner.invoke(app, ["da", "check", str(good), "--store", str(store)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"bytes": 4, "ok": True, "pointer": str(good)}
    r = runner.invoke(app, ["da", "check", str(good), missing, "da://nope/0x00",
                            "--store", str(store)])
    assert r.exit_code == 1
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["ok"] for x in rows] == [True, False, False]
    assert rows[1]["error"] == "BlobNotFoundError"
    assert rows[2]["error"] == "MalformedPointerError"
