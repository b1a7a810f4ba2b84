"""What the explorer reads besides the chain, each on its own schedule (never per request):
the KMS shards' health, release-log heads and decision counters; the operators' endpoints;
the light-audit reports on the Redis stream. Each source is untrusted: a bad answer is a
status line, not an exception."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from verinfer.errors import VerinferError
from verinfer.explorer.models import ENDPOINT, ModelNames
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted
from verinfer.verifier.audit_stream import StreamKeys
from verinfer.verifier.reports import SignedAuditReport

log = logging.getLogger("verinfer.explorer")
#: Bytes read from any probed endpoint; a shard's or operator's answer is a few hundred.
MAX_PROBE_BYTES = 256 * 1024
#: Stream reports kept in memory (the newest): anyone who can write the stream can flood it.
MAX_STREAM_ROWS = 10_000
#: Model ids asked of each endpoint per poll, and how long before an id it did not name is
#: asked again.
NAMES_PER_POLL = 20
NAME_RETRY_S = 60.0
_DECISIONS = re.compile(r'^kms_release_decisions_total\{decision="(released|refused)"[^}]*\}'
                        r"\s+([0-9.eE+]+)$", re.MULTILINE)


@dataclass
class ShardStatus:
    url: str
    ok: bool = False
    index: int | None = None
    address: str = ""
    insecure_software_enclave: bool | None = None
    log_count: int | None = None
    released: int | None = None
    refused: int | None = None
    error: str = ""
    checked_at: float = 0.0


@dataclass
class EndpointStatus:
    url: str
    ok: bool = False
    models: list[str] = field(default_factory=list)
    error: str = ""
    checked_at: float = 0.0


@dataclass
class AuditReportRow:
    entry_id: str
    job_id: str
    receipt_digest: bytes
    auditor: str
    matches: bool
    reason: str
    issued_at: int
    signature_ok: bool


def _get_bounded(client: httpx.Client, url: str) -> bytes:
    """The body of a GET, read in chunks and abandoned past MAX_PROBE_BYTES: a probed
    endpoint is not trusted to send a small answer."""
    with client.stream("GET", url) as r:
        r.raise_for_status()
        body = bytearray()
        for chunk in r.iter_bytes():
            body += chunk
            if len(body) > MAX_PROBE_BYTES:
                raise ValueError(f"answer longer than {MAX_PROBE_BYTES} bytes")
    return bytes(body)


def _get_json(client: httpx.Client, url: str) -> Any:
    return loads_untrusted(_get_bounded(client, url), max_bytes=MAX_PROBE_BYTES, what=url)


def probe_shard(client: httpx.Client, url: str) -> ShardStatus:
    st = ShardStatus(url, checked_at=time.time())
    try:
        h = _get_json(client, url + "/health")
        head = _get_json(client, url + "/v1/log/head")
        metrics = _get_bounded(client, url + "/metrics").decode("utf-8", "replace")
    except (httpx.HTTPError, ValueError, UntrustedJsonError) as e:
        st.error = f"{type(e).__name__}: {e}"[:200]
        return st
    if isinstance(h, dict):
        st.index = h.get("shard_index") if isinstance(h.get("shard_index"), int) else None
        st.address = str(h.get("address", ""))[:42]
        ins = h.get("insecure_software_enclave")
        st.insecure_software_enclave = ins if isinstance(ins, bool) else None
    if isinstance(head, dict) and isinstance(head.get("count"), int):
        st.log_count = head["count"]
    counts = {"released": 0, "refused": 0}
    for kind, value in _DECISIONS.findall(metrics):
        try:  # the pattern admits "e", "." and "1e999": the shard's text, not a number yet
            counts[kind] += int(float(value))
        except (ValueError, OverflowError):
            st.error = f"/metrics: {kind} count {value[:40]!r} is not a number"
            return st
    st.released, st.refused = counts["released"], counts["refused"]
    st.ok = True
    return st


def probe_endpoint(client: httpx.Client, url: str) -> EndpointStatus:
    st = EndpointStatus(url, checked_at=time.time())
    try:
        body = _get_json(client, url + "/v1/models")
    except (httpx.HTTPError, ValueError, UntrustedJsonError) as e:
        st.error = f"{type(e).__name__}: {e}"[:200]
        return st
    data = body.get("data") if isinstance(body, dict) else None
    st.models = [str(m.get("id"))[:100] for m in data if isinstance(m, dict)][:20] \
        if isinstance(data, list) else []
    st.ok = True
    return st


def probe_model_name(client: httpx.Client, url: str, model_id: bytes) -> str | None:
    """The name an operator endpoint serves ``model_id`` under (``GET /v1/models/0x<id>``
    answers that model's card), or None."""
    try:
        card = _get_json(client, f"{url}/v1/models/0x{model_id.hex()}")
    except (httpx.HTTPError, ValueError, UntrustedJsonError):
        return None
    name = card.get("id") if isinstance(card, dict) else None
    return name if isinstance(name, str) and not name.startswith("0x") else None


class AuditReportReader:
    """Reads ``<prefix>audit:reports`` incrementally (XRANGE after the last id seen); never
    writes (no consumer group). A malformed or badly signed report is counted, not shown as
    valid."""

    def __init__(self, redis_url: str, prefix: str, *, batch: int = 500) -> None:
        import redis

        self.r = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=3)
        self.keys = StreamKeys(prefix)
        self.batch = batch
        self.last_id = "0-0"
        self.rows: list[AuditReportRow] = []  # the newest MAX_STREAM_ROWS
        self.dropped = 0  # older rows let go
        self.malformed = 0
        self.error = ""

    def fetch(self) -> list[tuple[str, dict[str, Any]]]:
        """The entries after the last one seen (a Redis call: made outside any lock)."""
        lo = "-" if self.last_id == "0-0" else f"({self.last_id}"
        entries: Any = self.r.xrange(self.keys.reports, min=lo, count=self.batch)
        return [(str(i), dict(f)) for i, f in entries]

    def fold(self, entries: list[tuple[str, dict[str, Any]]]) -> int:
        """Parses and checks fetched entries into ``rows`` (under the prober's lock)."""
        for entry_id, f in entries:
            self.last_id = entry_id
            try:
                signed = SignedAuditReport.from_json(loads_untrusted(
                    str(f.get("report", "")), max_bytes=64 * 1024, what="audit report"))
            except (VerinferError, ValueError, TypeError):
                self.malformed += 1
                continue
            try:
                signed.verify()
                sig_ok = True
            except VerinferError:
                sig_ok = False
            rep = signed.report
            self.rows.append(AuditReportRow(str(entry_id), str(rep.job_id)[:100],
                                            rep.receipt_digest, str(rep.auditor)[:42],
                                            rep.verdict.agrees, str(rep.verdict.reason)[:100],
                                            rep.issued_at, sig_ok))
        if len(self.rows) > MAX_STREAM_ROWS:
            extra = len(self.rows) - MAX_STREAM_ROWS
            del self.rows[:extra]
            self.dropped += extra
        return len(entries)


class Prober:
    """Polls the shards, the operator endpoints and the audit stream every ``interval_s``;
    pages read the last snapshot under ``lock``."""

    def __init__(self, kms_urls: list[str], operator_urls: list[str],
                 audits: AuditReportReader | None, *, interval_s: float = 3.0,
                 names: ModelNames | None = None,
                 model_ids: Callable[[], list[bytes]] | None = None) -> None:
        self.lock = threading.Lock()
        self.names = names
        self.model_ids = model_ids  # the model ids approved on chain (read from the index)
        self._asked: dict[tuple[str, bytes], float] = {}
        self.kms_urls = [u.rstrip("/") for u in kms_urls]
        self.operator_urls = [u.rstrip("/") for u in operator_urls]
        self.audits = audits
        self.interval_s = interval_s
        self.shards: list[ShardStatus] = [ShardStatus(u) for u in self.kms_urls]
        self.endpoints: list[EndpointStatus] = [EndpointStatus(u) for u in self.operator_urls]
        self.version = 0

    def poll_once(self) -> None:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            shards = [probe_shard(client, u) for u in self.kms_urls]
            endpoints = [probe_endpoint(client, u) for u in self.operator_urls]
            named = self.name_models(client, endpoints)
        new_reports = 0
        if self.audits is not None:
            try:
                entries = self.audits.fetch()
                with self.lock:
                    new_reports = self.audits.fold(entries)
                    self.audits.error = ""
            except Exception as e:  # Redis down: the page says so
                with self.lock:
                    self.audits.error = f"{type(e).__name__}: {e}"[:200]
        with self.lock:
            changed = named or new_reports > 0 or \
                [(s.ok, s.log_count, s.released) for s in shards] != \
                [(s.ok, s.log_count, s.released) for s in self.shards] or \
                [e.ok for e in endpoints] != [e.ok for e in self.endpoints]
            self.shards, self.endpoints = shards, endpoints
            if changed:
                self.version += 1

    def name_models(self, client: httpx.Client, endpoints: list[EndpointStatus]) -> bool:
        """Asks each live endpoint the name of the approved model ids the deployment's list
        does not name (a few per poll; an id an endpoint did not name is asked again after
        NAME_RETRY_S). True if a name was learned."""
        if self.names is None or self.model_ids is None:
            return False
        todo = self.names.missing(self.model_ids())
        changed = False
        now = time.monotonic()
        for e in endpoints:
            if not e.ok:
                continue
            asked = 0
            for mid in todo:
                if asked >= NAMES_PER_POLL:
                    break
                if self._asked.get((e.url, mid), 0.0) > now:
                    continue
                asked += 1
                self._asked[(e.url, mid)] = now + NAME_RETRY_S
                name = probe_model_name(client, e.url, mid)
                if name is not None:
                    changed |= self.names.set(mid, name, f"{ENDPOINT} {e.url}")
        if len(self._asked) > 10_000:
            self._asked.clear()
        return changed

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a probe bug must not freeze every status at its last value
                log.exception("explorer: probing failed")
            stop.wait(self.interval_s)
