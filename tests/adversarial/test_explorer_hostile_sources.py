"""The explorer shows what operators and KMS shards hand it: signed receipts from batch
manifests on DA, shards' /health and /metrics. Each attack below took a page or a background
thread down with a value that parses but was never range-checked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from fastapi.testclient import TestClient

from verinfer.chain.bindings import BatchRegistryContract
from verinfer.chain.structs import ETHER, Role
from verinfer.da_client.factory import DARouter
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import ManifestEntry, build_manifest
from verinfer.explorer.app import create_app
from verinfer.explorer.follower import ChainFollower
from verinfer.explorer.index import EventMeta, Index
from verinfer.explorer.probes import probe_shard
from verinfer.explorer.views import Context
from verinfer.receipts.eip712 import Domain, Receipt, ReceiptSigner
from verinfer.receipts.signed import SignedReceipt

DOMAIN = Domain(31337, "0x" + "cd" * 20)
OPERATOR = Account.from_key(b"\x09" * 32)
#: the largest issuedAt a manifest carries (RFC 8785 JSON integers end at 2^53 - 1): year ~285M
FAR = 2**53 - 1


def test_receipt_issued_after_year_9999_does_not_take_its_pages_down(tmp_path: Path) -> None:
    """issuedAt is an integer the operator signs; the explorer formatted it with
    ``datetime.fromtimestamp``, which raises past year 9999. The receipt's page, its batch's
    page (every receipt of the batch) and their /api twins answered 500. Who gains: an
    operator that hides a batch -- the receipts, the Merkle proofs and the `verinfer
    challenge` command a reader would copy -- from the explorer, for the price of one receipt
    with an absurd issuedAt in the batch. Now such a time shows as the number it is."""
    da = LocalDAClient(tmp_path / "da")
    entries = []
    for i, issued_at in enumerate((1_700_000_000, FAR, 253_402_300_800)):
        ptr = da.put(f"ciphertext {i}".encode())
        r = Receipt(operator=OPERATOR.address, chain_id=DOMAIN.chain_id, model_id=b"\x11" * 32,
                    engine_fingerprint_hash=b"\x22" * 32, req_hash=i.to_bytes(32, "big"),
                    out_hash=b"\x33" * 32, key_epoch=1, ciphertext_hash=ptr.blob_sha256,
                    issued_at=issued_at)
        entries.append(ManifestEntry(SignedReceipt.sign(r, DOMAIN,
                                                        ReceiptSigner(OPERATOR.key)), ptr))
    manifest = build_manifest(entries)
    idx = Index()
    idx.apply("ParamsSet", {"params": {"publicationDeadline": 600}}, EventMeta(0, 1, b"", 0))
    idx.apply("Registered", {"account": OPERATOR.address, "role": int(Role.OPERATOR),
                             "amount": 10 * ETHER}, EventMeta(1, 2, b"", 0))
    idx.apply("BatchCommitted", {"operator": OPERATOR.address, "root": manifest.root,
                                 "leafCount": len(entries),
                                 "daPointer": str(da.put(manifest.to_bytes()))},
              EventMeta(2, 1_700_000_100, b"\x01" * 32, 0))
    follower = ChainFollower.__new__(ChainFollower)  # only its DA side: no chain here
    follower.index, follower.da, follower.domain, follower._retry_at = (
        idx, DARouter([da]), DOMAIN, {})
    follower._read_manifests()
    bid = "0x" + BatchRegistryContract.batch_id(OPERATOR.address, manifest.root).hex()
    client = TestClient(create_app(Context(idx, DOMAIN, None, DARouter([da]), "http://rpc",
                                           "/d/deployment.json")))
    far = "0x" + entries[1].signed.digest.hex()
    for path in (f"/receipt/{far}", f"/api/receipt/{far}", f"/batch/{bid}", f"/api/batch/{bid}"):
        resp = client.get(path)
        assert resp.status_code == 200, (path, resp.text[:300])
        assert f"{FAR} (not a date)" in resp.text, path
    assert "2023-11-14 22:13:20 UTC" in client.get(f"/batch/{bid}").text  # a real date still


@pytest.mark.parametrize("count", ["1e999", "e", "."])
def test_shard_metrics_that_are_no_number_do_not_kill_the_prober(count: str) -> None:
    """A KMS shard's /metrics line ``kms_release_decisions_total{decision="released"} 1e999``
    matched the explorer's pattern and then failed ``int(float(...))`` outside any handler:
    the exception ended the prober thread, freezing every shard's and operator's status on
    the KMS and overview pages at its last value. Who gains: a shard (or whoever answers at
    its URL) that wants its later outage, or another shard's, not to show; it costs one
    metrics line. Now that shard's status says its metrics are unreadable."""
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text='kms_release_decisions_total{decision="released"} '
                                             f"{count}\n")
        if request.url.path == "/health":
            return httpx.Response(200, json={"shard_index": 1, "address": "0x" + "ab" * 20})
        return httpx.Response(200, json={"count": 3})

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        st = probe_shard(client, "http://shard")
    assert not st.ok and "is not a number" in st.error, st


def test_stream_reports_by_keys_that_are_no_verifier_are_not_counted() -> None:
    """The explorer's light-audit counts ("N signed reports, M mismatch", on the overview and
    the audits page) took every report on the Redis stream whose JSON parsed: one signed with
    a fresh key that stakes nothing, or naming a real verifier under a signature that does not
    recover to it, counted as a mismatch against the receipt's operator. Who gains: anyone
    who can write the stream (any verifier's Redis credentials) makes an honest operator look
    caught, at no cost. Now only reports signed by a verifier staked on this chain count;
    the others are counted apart as unverified (and the rows kept in memory are capped)."""
    from verinfer.explorer.probes import AuditReportReader, Prober
    from verinfer.verifier.reports import AuditReport, SignedAuditReport
    from verinfer.verifier.votes import Verdict

    verifier, stranger = Account.from_key(b"\x0a" * 32), Account.from_key(b"\x0b" * 32)
    idx = Index()
    idx.apply("Registered", {"account": verifier.address, "role": int(Role.VERIFIER),
                             "amount": ETHER}, EventMeta(1, 2, b"", 0))
    receipt, out_hash = b"\x01" * 32, b"\x02" * 32

    def report(signer: Account, vote: bytes, *, named: str | None = None) -> dict[str, str]:
        """A report signed by ``signer``; ``named``: the auditor it then claims to be."""
        rep = AuditReport("job", receipt, signer.address, Verdict(vote, "", out_hash),
                          1_700_000_000)
        signed = SignedAuditReport.sign(rep, signer)
        if named is not None:
            signed = SignedAuditReport(dataclasses.replace(rep, auditor=named), signed.signature)
        return {"report": json.dumps(signed.to_json())}

    reader = AuditReportReader("redis://127.0.0.1:1/0", "x:")  # fed by hand: no Redis read
    reader.fold([("1-0", report(verifier, out_hash)),  # a real match
                 ("2-0", report(stranger, b"\x03" * 32)),  # self-signed by a stranger
                 ("3-0", report(stranger, b"\x03" * 32, named=verifier.address))])
    prober = Prober([], [], reader)
    client = TestClient(create_app(Context(idx, DOMAIN, prober, None, "http://rpc", "/d")))
    stream = client.get("/api/audits").json()["counts"]["stream"]
    assert (stream["reports"], stream["matches"], stream["mismatches"]) == (1, 1, 0), stream
    assert stream["unverified"] == 2, stream


def test_a_stream_flood_is_capped_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every parsed stream report was appended to a list kept for the process's life, and
    every page view summed over all of it: whoever can write the stream grows the explorer's
    memory and page cost without bound, one XADD (even a badly signed report) at a time. Now
    the newest MAX_STREAM_ROWS are kept and the rest counted as dropped."""
    from verinfer.explorer import probes
    from verinfer.verifier.reports import AuditReport, SignedAuditReport
    from verinfer.verifier.votes import Verdict

    monkeypatch.setattr(probes, "MAX_STREAM_ROWS", 5)
    rep = AuditReport("job", b"\x01" * 32, OPERATOR.address,
                      Verdict(b"\x02" * 32, "", b"\x02" * 32), 1_700_000_000)
    entry = {"report": json.dumps(SignedAuditReport(rep, b"\x00" * 65).to_json())}
    reader = probes.AuditReportReader("redis://127.0.0.1:1/0", "x:")
    for i in range(4):
        reader.fold([(f"{i}-{j}", entry) for j in range(3)])
    assert len(reader.rows) == 5 and reader.dropped == 7
    assert reader.rows[-1].entry_id == "3-2"  # the newest are the ones kept
