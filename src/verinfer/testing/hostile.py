"""Hostile clients and hostile peers against verinfer's HTTP services, and what they cost
(issue 32: every service holds its budget against hostile clients; docs/budgets.md).

Shared by ``tests/adversarial/test_hostile_services.py`` (a reduced, fast scale) and
``bench/hostile.py`` (the full scale). Everything runs on loopback against *real processes*:
``verinfer serve`` (the operator, tiny model), one ``verinfer kms shard serve``, ``verinfer
explorer`` (pointed at hostile peers) and the fake EigenDA proxy in a process of its own.

The attackers connect from 127.0.0.2, honest clients from 127.0.0.1 (both loopback on Linux), so
a service that budgets per client address can tell them apart, as it could on a network.

Attacks (:data:`ATTACKS`), each bounded in count and time:

- ``slow_body``: ``Content-Length: N`` (the service's body cap), N-1 bytes, then silence;
- ``slowloris``: request headers one line every 0.3 s, never the blank line;
- ``oversized``: a declared length over the cap, and a chunked body twice the cap;
- ``misencoded``: a valid body re-encoded UTF-16LE/BE, UTF-32LE/BE, with and without BOMs,
  and UTF-8 behind a BOM, each near the cap;
- ``bombs``: value-count and depth bombs (``[[],[],…]``, ``[[[…]]]``, ``[0,0,…]``,
  ``["","",…]``) at the cap, bare and inside a field of a real request;
- ``flood``: cheap refused requests (wrong key, unknown route, bad JSON), each with a forged
  ``X-Forwarded-For``;
- ``idle``: many connections that send nothing;
- ``hostile_peers``: the service's own outbound calls go to peers that drip their answer a
  byte at a time, or send a body far over any sane size (:class:`HostilePeer`).

Each case (:func:`run_case`) measures, while the attack runs: the service's RSS (``VmRSS``
from /proc of the real process) against its value just before, the p99 latency of its cheap
endpoint (``/health``, the explorer's ``/api/status``) from a fresh honest connection, the
growth of its data directory on disk, and whether honest requests sent meanwhile succeed; and
after it, whether the service answers an honest request again.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import secrets
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from verinfer.ports import free_port

ATTACK_SRC = "127.0.0.2"
HONEST_SRC = "127.0.0.1"

ATTACKS = ("slow_body", "slowloris", "oversized", "misencoded", "bombs", "flood", "idle",
           "hostile_peers")


@dataclass(frozen=True)
class Budget:
    """What one case may cost a service (docs/budgets.md, the summary table)."""

    rss_growth_mb: float = 256.0
    health_p99_ms: float = 250.0
    disk_growth_mb: float = 64.0
    honest_success: float = 1.0
    #: a connection that stalls before its request's headers are in (slowloris, idle) is
    #: closed within this many seconds (checked when an attack lasts longer)
    stall_s: float = 12.0


BUDGET = Budget()


@dataclass(frozen=True)
class Scale:
    """How hard each attack pushes; every loop is bounded by these counts and ``hold_s``."""

    hold_s: float  # each attack runs this long
    conns: int  # slow bodies, slowloris
    slow_body_mb: int  # slow bodies: at most this many MiB declared in all
    idle_conns: int
    workers: int  # threads sending bombs, floods, oversized and mis-encoded bodies
    max_requests: int  # per attack, across its workers
    probe_every_s: float = 0.05
    quiet_probes: int = 10
    honest_every_s: float = 0.25
    settle_s: float = 0.5


FAST = Scale(hold_s=1.2, conns=24, slow_body_mb=96, idle_conns=600, workers=2,
             max_requests=300, quiet_probes=6, settle_s=0.3)
FULL = Scale(hold_s=14.0, conns=64, slow_body_mb=512, idle_conns=1000, workers=4,
             max_requests=4000)


@dataclass
class Service:
    """One running service, as the attacks and the monitor see it."""

    name: str
    host: str
    port: int
    pid: int
    health_path: str
    honest: Callable[[], bool]  # one honest request from HONEST_SRC: did it succeed?
    data_dir: Path | None = None
    body_path: str | None = None  # a route that reads a JSON body
    max_body_bytes: int = 0
    padded_body: Callable[[int], bytes] | None = None  # a valid UTF-8 body of about n bytes
    bomb_template: bytes = b'{"a":%s}'  # a real request with a field the bomb goes into
    attack_headers: dict[str, str] = field(default_factory=dict)  # e.g. a paying client's key
    refused: Sequence[tuple[str, str, dict[str, str], bytes]] = ()  # method, path, hdrs, body
    attacks: tuple[str, ...] = ATTACKS[:-1]
    started_at: float = field(default_factory=time.monotonic)  # when it first answered


@dataclass
class CaseResult:
    service: str
    attack: str
    rss_before_mb: float
    rss_peak_mb: float
    rss_after_mb: float
    rss_growth_mb: float
    health_p99_ms: float
    health_quiet_p99_ms: float  # the same probe just before the attack (the machine's noise)
    health_n: int
    health_failed: int
    honest_ok: int
    honest_n: int
    disk_growth_mb: float
    cpu_share: float  # CPU seconds the service spent per second of the attack
    recovered: bool  # an honest request and /health succeed after the attack
    answers: dict[str, int]  # what the attack's requests got: status codes, "closed", "held"
    honest_failures: dict[str, int]  # what the failed honest requests got
    seconds: float
    hold_s: float

    @property
    def honest_ratio(self) -> float:
        return self.honest_ok / self.honest_n if self.honest_n else 0.0

    @property
    def server_errors(self) -> int:
        """Answers that say the service broke (5xx other than 503's "busy, retry")."""
        return sum(n for k, n in self.answers.items() if k.isdigit() and int(k) >= 500
                   and k != "503")

    def over_budget(self, budget: Budget = BUDGET, *, beside_noise: bool = False) -> list[str]:
        """The budget lines this case broke. ``beside_noise``: the /health budget is counted
        on top of the p99 the same probe saw just before the attack (a loaded, shared machine
        stalls every process alike; the budget is what the attack adds)."""
        out = []
        if self.rss_growth_mb > budget.rss_growth_mb:
            out.append(f"RSS +{self.rss_growth_mb:.0f} MB > {budget.rss_growth_mb:.0f}")
        allowed = budget.health_p99_ms + (self.health_quiet_p99_ms if beside_noise else 0.0)
        if self.health_p99_ms > allowed or self.health_failed:
            out.append(f"health p99 {self.health_p99_ms:.0f} ms > {allowed:.0f} (quiet "
                       f"{self.health_quiet_p99_ms:.0f}; {self.health_failed}/{self.health_n} "
                       f"probes failed)")
        if self.disk_growth_mb > budget.disk_growth_mb:
            out.append(f"disk +{self.disk_growth_mb:.1f} MB > {budget.disk_growth_mb:.0f}")
        if self.honest_ratio < budget.honest_success:
            out.append(f"honest {self.honest_ok}/{self.honest_n}")
        if not self.recovered:
            out.append("no honest answer after the attack")
        if (self.attack in ("slowloris", "idle") and self.hold_s > budget.stall_s
                and self.answers.get("held")):
            out.append(f"{self.answers['held']} stalled connections still open after "
                       f"{self.hold_s:g} s (> {budget.stall_s:g} s)")
        if self.server_errors:
            out.append(f"{self.server_errors} answers of 5xx (not 503)")
        return out

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "honest_ratio": round(self.honest_ratio, 3)}


# ---- measuring ------------------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ProcessLookupError(pid)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def disk_bytes(root: Path | None) -> int:
    if root is None or not root.exists():
        return 0
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def request(host: str, port: int, method: str, path: str, *, body: bytes | None = None,
            headers: dict[str, str] | None = None, src: str = HONEST_SRC,
            timeout: float = 10.0) -> tuple[int, bytes]:
    """One request on a fresh connection from ``src``: (status, body)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout, source_address=(src, 0))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def p99(samples: Sequence[float]) -> float:
    if not samples:
        return math.inf
    s = sorted(samples)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


class Monitor:
    """Samples the service while an attack runs (threads, stopped by ``stop``)."""

    PROBE_TIMEOUT_S = 5.0

    def __init__(self, svc: Service, scale: Scale) -> None:
        self.svc, self.scale = svc, scale
        self.stop_event = threading.Event()
        self.rss_before = rss_mb(svc.pid)
        self.rss_peak = self.rss_before
        self.disk_before = disk_bytes(svc.data_dir)
        self.latencies: list[float] = []
        self.health_failed = 0
        self.honest: list[bool] = []
        self.honest_failures: Counter[str] = Counter()
        self.threads = [threading.Thread(target=f, daemon=True)
                        for f in (self._rss, self._health, self._honest)]

    def quiet(self, probes: int) -> float:
        """p99 of ``probes`` health probes before the attack (then forgotten)."""
        for _ in range(probes):
            self.probe()
            time.sleep(self.scale.probe_every_s)
        out = p99(self.latencies)
        self.latencies.clear()
        self.health_failed = 0
        return out

    def start(self) -> Monitor:
        self.cpu_before = cpu_seconds(self.svc.pid)
        for t in self.threads:
            t.start()
        return self

    def _rss(self) -> None:
        while not self.stop_event.wait(0.05):
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                self.rss_peak = max(self.rss_peak, rss_mb(self.svc.pid))

    def probe(self) -> bool:
        t0 = time.monotonic()
        try:
            status, _ = request(self.svc.host, self.svc.port, "GET", self.svc.health_path,
                                timeout=self.PROBE_TIMEOUT_S)
            ok = status == 200
        except (OSError, http.client.HTTPException):
            ok = False
        self.latencies.append(time.monotonic() - t0 if ok else self.PROBE_TIMEOUT_S)
        self.health_failed += not ok
        return ok

    def _health(self) -> None:  # the first at once: an attack may end early (max_requests)
        self.probe()
        while not self.stop_event.wait(self.scale.probe_every_s):
            self.probe()

    def _honest(self) -> None:
        self.honest.append(_honest_call(self.svc, self.honest_failures))
        while not self.stop_event.wait(self.scale.honest_every_s):
            self.honest.append(_honest_call(self.svc, self.honest_failures))

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(30)


def _honest_call(svc: Service, failures: Counter[str] | None = None) -> bool:
    try:
        return bool(svc.honest())
    except (HonestFailure, OSError, http.client.HTTPException, ValueError, KeyError) as e:
        if failures is not None:
            failures[f"{type(e).__name__}: {e}"[:200]] += 1
        return False


# ---- attacks --------------------------------------------------------------------------------
def _attack_socket(svc: Service, timeout: float = 2.0) -> socket.socket:
    return socket.create_connection((svc.host, svc.port), timeout=timeout,
                                    source_address=(ATTACK_SRC, 0))


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status_of(raw: bytes) -> str:
    try:
        return raw.split(b" ", 2)[1].decode()
    except (IndexError, UnicodeDecodeError):
        return "garbled"


def _watch(socks: list[socket.socket], until: float, seen: Counter[str]) -> None:
    """Reads what the service answers on ``socks`` until ``until``; counts each socket's
    status (or "closed" without one, "held" when still open at the end); closes them."""
    sel = selectors.DefaultSelector()
    got: dict[socket.socket, bytes] = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, s)
        got[s] = b""
    open_ = set(socks)
    while open_ and time.monotonic() < until:
        for key, _ in sel.select(timeout=max(0.0, min(0.1, until - time.monotonic()))):
            s = key.data
            try:
                chunk = s.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if chunk:
                got[s] += chunk[:256] if len(got[s]) < 256 else b""
                continue
            sel.unregister(s)
            open_.discard(s)
            seen[_status_of(got[s]) if got[s] else "closed"] += 1
    for s in open_:
        seen[_status_of(got[s]) if got[s] else "held"] += 1
    sel.close()
    for s in socks:
        s.close()


def attack_slow_body(svc: Service, sc: Scale, until: float, seen: Counter[str]) -> None:
    n = svc.max_body_bytes
    conns = max(1, min(sc.conns, sc.slow_body_mb * 1024 * 1024 // n))
    head = _head("POST", svc.body_path or "/", {**svc.attack_headers,
                                                 "Content-Type": "application/json",
                                                 "Content-Length": str(n)})
    body = b"{" + b" " * (n - 2)  # N-1 bytes: one short of what the head declared
    socks = []
    for _ in range(conns):
        if time.monotonic() >= until:
            break
        try:
            s = _attack_socket(svc)
        except OSError:
            seen["connect_failed"] += 1
            continue
        try:
            s.sendall(head + body)
        except TimeoutError:
            seen["send_stalled"] += 1  # the service stopped reading: fine
        except OSError:
            pass  # answered and closed already: _watch reads the answer
        socks.append(s)
    # then silence, for at least half the attack's time once every body is in: the hold,
    # not the sending, is the attack (sending 100 MiB can take most of a short case)
    _watch(socks, max(until, time.monotonic() + sc.hold_s / 2), seen)


def attack_slowloris(svc: Service, sc: Scale, until: float, seen: Counter[str]) -> None:
    socks = []
    for _ in range(sc.conns):
        try:
            s = _attack_socket(svc)
            s.sendall(f"GET {svc.health_path} HTTP/1.1\r\nHost: x\r\n".encode())
            socks.append(s)
        except OSError:
            seen["connect_failed"] += 1
    i = 0
    while socks and time.monotonic() + 0.3 < until:
        time.sleep(0.3)
        i += 1
        for s in list(socks):
            try:
                s.sendall(f"X-Drip-{i}: {i}\r\n".encode())
            except OSError:  # the service cut it off
                socks.remove(s)
                s.close()
                seen["closed"] += 1
    _watch(socks, until, seen)


def _send_and_read(svc: Service, payload: Iterator[bytes] | bytes, seen: Counter[str],
                   timeout: float = 5.0) -> None:
    """Sends a request (bytes, or chunks until the service stops reading) and counts its
    status; a connection cut before any answer counts as "closed"."""
    try:
        s = _attack_socket(svc, timeout)
    except OSError:
        seen["connect_failed"] += 1
        return
    with s:
        try:
            if isinstance(payload, bytes):
                s.sendall(payload)
            else:
                for chunk in payload:
                    s.sendall(chunk)
        except OSError:
            pass  # refused mid-body: the answer (if any) is waiting
        try:
            raw = s.recv(256)
        except TimeoutError:
            seen["no_answer"] += 1
            return
        except OSError:
            raw = b""
        seen[_status_of(raw) if raw else "closed"] += 1


def _workers(sc: Scale, until: float, one: Callable[[int], None]) -> None:
    """``sc.workers`` threads calling ``one(i)`` (i counts up across them) until ``until`` or
    ``sc.max_requests`` calls in all."""
    lock = threading.Lock()
    count = [0]

    def loop() -> None:
        while time.monotonic() < until:
            with lock:
                if count[0] >= sc.max_requests:
                    return
                i = count[0]
                count[0] += 1
            one(i)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(sc.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, until - time.monotonic() + 10))


def attack_oversized(svc: Service, sc: Scale, until: float, seen: Counter[str]) -> None:
    n = svc.max_body_bytes
    block = b" " * 65536

    def declared(_: int) -> Iterator[bytes]:
        yield _head("POST", svc.body_path or "/", {**svc.attack_headers,
                                                    "Content-Type": "application/json",
                                                    "Content-Length": str(n + 1)})
        for _ in range(0, n + 1, len(block)):
            yield block

    def chunked(_: int) -> Iterator[bytes]:
        yield _head("POST", svc.body_path or "/", {**svc.attack_headers,
                                                    "Content-Type": "application/json",
                                                    "Transfer-Encoding": "chunked"})
        for _ in range(0, 2 * n, len(block)):
            yield b"%x\r\n" % len(block) + block + b"\r\n"
        yield b"0\r\n\r\n"

    _workers(sc, until, lambda i: _send_and_read(svc, (declared if i % 2 else chunked)(i),
                                                 seen))


ENCODINGS = ("utf-16-le", "utf-16-be", "utf-16", "utf-32-le", "utf-32-be", "utf-32",
             "utf-8-sig")


def misencoded_bodies(svc: Service) -> list[bytes]:
    """The service's honest body near its cap, in every encoding JSON's old detection read."""
    assert svc.padded_body is not None
    out = []
    for enc in ENCODINGS:
        width = 4 if "32" in enc else 2 if "16" in enc else 1
        text = svc.padded_body((svc.max_body_bytes - 256) // width).decode()
        out.append(text.encode(enc))
    return out


def bomb_bodies(svc: Service) -> list[bytes]:
    """Value-count and depth bombs that fill the cap, bare and inside a real request."""
    room = svc.max_body_bytes - len(svc.bomb_template) - 8
    k = room // 3
    bombs = [b"[" + b"[]," * (k - 1) + b"[]]",
             b"[" * (room // 2) + b"]" * (room // 2),
             b"[" + b"0," * (room // 2 - 1) + b"0]",
             b"[" + b'"",' * (k - 1) + b'""]']
    return [*bombs, *(svc.bomb_template % b for b in bombs)]


def _post_bodies(svc: Service, sc: Scale, until: float, seen: Counter[str],
                 bodies: list[bytes]) -> None:
    def one(i: int) -> None:
        body = bodies[i % len(bodies)]
        head = _head("POST", svc.body_path or "/", {**svc.attack_headers,
                                                     "Content-Type": "application/json",
                                                     "Content-Length": str(len(body))})
        _send_and_read(svc, head + body, seen, timeout=10.0)

    _workers(sc, until, one)


def attack_misencoded(svc: Service, sc: Scale, until: float, seen: Counter[str]) -> None:
    _post_bodies(svc, sc, until, seen, misencoded_bodies(svc))


def attack_bombs(svc: Service, sc: Scale, until: float, seen: Counter[str]) -> None:
    _post_bodies(svc, sc, until, seen, bomb_bodies(svc))


def attack_flood(svc: Service, sc: Scale, until: float, seen: Counter[str]) -> None:
    """Cheap refused requests on kept-alive connections, each with a forged X-Forwarded-For
    (a service that believed it would give every request a fresh per-address budget)."""
    assert svc.refused
    local = threading.local()

    def one(i: int) -> None:
        method, path, headers, body = svc.refused[i % len(svc.refused)]
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(
                svc.host, svc.port, timeout=5, source_address=(ATTACK_SRC, 0))
        forged = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        try:
            conn.request(method, path, body=body or None,
                         headers={**headers, "X-Forwarded-For": forged,
                                  "X-Real-IP": forged})
            r = conn.getresponse()
            r.read()
            seen[str(r.status)] += 1
            if r.will_close:
                conn.close()
                local.conn = None
        except (OSError, http.client.HTTPException):
            seen["closed"] += 1
            conn.close()
            local.conn = None

    _workers(sc, until, one)


def attack_idle(svc: Service, sc: Scale, until: float, seen: Counter[str]) -> None:
    socks = []
    for _ in range(sc.idle_conns):
        if time.monotonic() >= until:
            break
        try:  # a short connect timeout: a full accept queue must not end the attack
            socks.append(_attack_socket(svc, timeout=0.5))
        except OSError:
            seen["connect_failed"] += 1
    _watch(socks, until, seen)


@dataclass
class Stalled:
    """Connections from ATTACK_SRC that stall before their request's headers are complete:
    one sent part of a request line and stopped, one sent nothing."""

    socks: list[socket.socket]
    opened_at: float

    def closed_by_service(self) -> list[bool]:
        out = []
        for s in self.socks:
            s.setblocking(False)
            try:
                out.append(s.recv(4096) == b"")  # EOF: closed (an answer would be bytes)
            except BlockingIOError:
                out.append(False)  # still open, nothing sent
            except OSError:
                out.append(True)  # reset
        return out


@contextlib.contextmanager
def stalled_connections(svc: Service) -> Iterator[Stalled]:
    partial = _attack_socket(svc)
    partial.sendall(f"GET {svc.health_path} HTTP/1.1\r\nHost: x\r\nX-Wait:".encode())
    held = Stalled([partial, _attack_socket(svc)], time.monotonic())
    try:
        yield held
    finally:
        for s in held.socks:
            s.close()


def attack_hostile_peers(svc: Service, sc: Scale, until: float, seen: Counter[str]) -> None:
    """The service was started against :class:`HostilePeer` s; this only lets time pass."""
    time.sleep(max(0.0, until - time.monotonic()))
    seen["waited"] += 1


ATTACK_FUNCS: dict[str, Callable[[Service, Scale, float, Counter[str]], None]] = {
    "slow_body": attack_slow_body, "slowloris": attack_slowloris, "oversized": attack_oversized,
    "misencoded": attack_misencoded, "bombs": attack_bombs, "flood": attack_flood,
    "idle": attack_idle, "hostile_peers": attack_hostile_peers}


def run_case(svc: Service, attack: str, scale: Scale) -> CaseResult:
    """Runs one attack on ``svc`` for ``scale.hold_s`` with the monitor on; then lets the
    service settle and checks it answers an honest client again."""
    seen: Counter[str] = Counter()
    mon = Monitor(svc, scale)
    quiet = mon.quiet(scale.quiet_probes)
    t0 = time.monotonic()
    mon.start()
    try:
        ATTACK_FUNCS[attack](svc, scale, t0 + scale.hold_s, seen)
    finally:
        mon.stop()
    cpu_share = (cpu_seconds(svc.pid) - mon.cpu_before) / (time.monotonic() - t0)
    time.sleep(scale.settle_s)
    recovered = False
    for _ in range(20):  # the attack's connections may take a moment to be closed
        if mon.probe() and _honest_call(svc):
            recovered = True
            break
        time.sleep(0.5)
    return CaseResult(
        service=svc.name, attack=attack, rss_before_mb=round(mon.rss_before, 1),
        rss_peak_mb=round(mon.rss_peak, 1), rss_after_mb=round(rss_mb(svc.pid), 1),
        rss_growth_mb=round(mon.rss_peak - mon.rss_before, 1),
        health_p99_ms=round(p99(mon.latencies) * 1000, 1),
        health_quiet_p99_ms=round(quiet * 1000, 1), health_n=len(mon.latencies),
        health_failed=mon.health_failed, honest_ok=sum(mon.honest), honest_n=len(mon.honest),
        disk_growth_mb=round((disk_bytes(svc.data_dir) - mon.disk_before) / 2**20, 2),
        cpu_share=round(cpu_share, 2), recovered=recovered, answers=dict(seen),
        honest_failures=dict(mon.honest_failures), seconds=round(time.monotonic() - t0, 2),
        hold_s=scale.hold_s)


# ---- hostile peers --------------------------------------------------------------------------
class HostilePeer:
    """A loopback HTTP peer for the services' *outbound* calls (GET and POST alike):

    - ``drip``: 200, ``Content-Length`` 1 MB, one byte every ``interval`` s (every read
      succeeds quickly, so a per-read timeout never fires);
    - ``huge``: 200, ``Content-Length`` 1 GiB of JSON-looking bytes as fast as the client reads;
    - ``silent``: reads the request, never answers.

    Every answer stops when the peer is stopped."""

    def __init__(self, mode: str, interval: float = 0.05) -> None:
        if mode not in ("drip", "huge", "silent"):
            raise ValueError(mode)
        self.mode, self.interval = mode, interval
        self.stopping = threading.Event()
        self.requests = 0
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def _answer(self) -> None:
                peer.requests += 1
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(min(n, 1 << 20))
                try:
                    if peer.mode == "silent":
                        peer.stopping.wait()
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length",
                                     str(1 << 30 if peer.mode == "huge" else 1 << 20))
                    self.end_headers()
                    if peer.mode == "huge":
                        block = b'{"a":' + b"1" * 65530 + b","
                        while not peer.stopping.is_set():
                            self.wfile.write(block)
                    else:
                        self.wfile.write(b"{")
                        while not peer.stopping.wait(peer.interval):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                except OSError:  # the client gave up
                    pass

            do_GET = do_POST = _answer

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hangs up on a hostile peer is the expected case

        self.server = Server((HONEST_SRC, 0), Handler)
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://{HONEST_SRC}:{self.server.server_address[1]}"

    def __enter__(self) -> HostilePeer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


# ---- the services, as real processes --------------------------------------------------------
def _wait_health(proc: subprocess.Popen[bytes], port: int, path: str, log: Path,
                 timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}: "
                               f"{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if request(HONEST_SRC, port, "GET", path, timeout=1)[0] == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"no answer on {path} within {timeout_s} s")


@contextlib.contextmanager
def _process(cmd: list[str], port: int, health: str, log: Path,
             env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        _wait_health(proc, port, health, log)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class HonestFailure(Exception):
    """An honest request was not served; the message says what it got."""


def _check(ok: bool, status: int, body: bytes) -> bool:
    if not ok:
        raise HonestFailure(f"{status} {body[:160]!r}")
    return True


HONEST_KEY = "honest-" + "h" * 24
ATTACKER_KEY = "paying-attacker-" + "a" * 16


@contextlib.contextmanager
def operator_service(model: Path, workdir: Path, *extra: str) -> Iterator[Service]:
    """``verinfer serve`` with the given model (served as ``tiny``), signing receipts into an
    operator directory (``operator init --unsafe-dev``: local DA, local KMS), two API keys: the
    honest client's and a paying attacker's (the body attacks use it)."""
    from verinfer.protocol.limits import MAX_BODY_BYTES

    opdir = workdir / "operator"
    r = subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(opdir),
                        "--light-kdf", "--batch-max-age-s", "0.3", "--unsafe-dev"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"operator init failed: {r.stderr[-2000:]}")
    port = free_port(HONEST_SRC)
    cmd = [sys.executable, "-m", "verinfer", "serve", "--model", str(model), "--port", str(port),
           "--name", "tiny", "--max-context", "512", "--unsafe-dev", "--operator-dir",
           str(opdir), *extra]
    with _process(cmd, port, "/health", workdir / "operator.log",
                  env={"VERINFER_API_KEYS": f"{HONEST_KEY},{ATTACKER_KEY}"}) as proc:
        def honest() -> bool:
            body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 2}).encode()
            status, out = request(HONEST_SRC, port, "POST", "/v1/completions", body=body,
                                  headers={"Authorization": f"Bearer {HONEST_KEY}",
                                           "Content-Type": "application/json"})
            return _check(status == 200 and "verification" in json.loads(out), status, out)

        def padded(n: int) -> bytes:
            head = b'{"model":"tiny","max_tokens":1,"prompt":"'
            return head + b"a" * max(0, n - len(head) - 2) + b'"}'

        yield Service(
            name="operator", host=HONEST_SRC, port=port, pid=proc.pid, health_path="/health",
            honest=honest, data_dir=opdir, body_path="/v1/completions",
            max_body_bytes=MAX_BODY_BYTES, padded_body=padded,
            bomb_template=b'{"model":"tiny","max_tokens":1,"prompt":%s}',
            attack_headers={"Authorization": f"Bearer {ATTACKER_KEY}"},
            refused=[("POST", "/v1/completions", {"Authorization": "Bearer wrong-key",
                                                   "Content-Type": "application/json"},
                      b'{"model":"tiny","prompt":"x"}'),
                     ("POST", "/v1/chat/completions", {"Content-Type": "application/json"},
                      b'{"model":'),
                     ("GET", "/v1/receipts/0x00", {"Authorization": "Bearer wrong-key"}, b""),
                     ("GET", "/nope", {}, b"")])


@contextlib.contextmanager
def kms_shard_service(workdir: Path, *extra: str) -> Iterator[Service]:
    """Shard 1 of a provisioned 2-of-2 cluster (``kms.local_cluster``) as a real
    ``verinfer kms shard serve`` process; its data directory holds its release log and its
    server log."""
    from verinfer.attestation.quotes import measurement
    from verinfer.kms.local_cluster import ShardProcesses, provision
    from verinfer.kms.shard_app import MAX_BODY_BYTES

    lay = provision(workdir / "kms", epoch=1, threshold=2, shares=2,
                    measurements=[measurement("sha256:" + "44" * 32, "code", "engine")],
                    unsafe_single_tree=True)
    with ShardProcesses(lay, extra_args=list(extra)) as procs:
        procs.start([1])
        url = lay.shards_info()[0].url
        port = int(url.rsplit(":", 1)[1])

        def honest() -> bool:
            status, out = request(HONEST_SRC, port, "POST", "/v1/nonce")
            return _check(status == 200 and "nonce" in json.loads(out), status, out)

        def padded(n: int) -> bytes:
            head = b'{"epoch":1,"purpose":"full_challenge","challenge_id":"'
            return head + b"c" * max(0, n - len(head) - 2) + b'"}'

        yield Service(
            name="kms_shard", host=HONEST_SRC, port=port, pid=procs.procs[1].pid,
            health_path="/health", honest=honest, data_dir=lay.data_dir(1),
            body_path="/v1/release", max_body_bytes=MAX_BODY_BYTES, padded_body=padded,
            bomb_template=b'{"epoch":1,"purpose":"full_challenge","nonces":%s}',
            refused=[("POST", "/v1/release", {"Content-Type": "application/json"}, b"{}"),
                     ("POST", "/v1/decrypt", {"Content-Type": "application/json"},
                      b'{"epoch":'),
                     ("GET", "/nope", {}, b"")])


@contextlib.contextmanager
def explorer_service(workdir: Path) -> Iterator[Service]:
    """``verinfer explorer`` whose chain RPC drips, whose KMS shard sends a 1 GiB answer and
    whose operator never answers (:class:`HostilePeer`): the client attacks and the
    ``hostile_peers`` case all run with its outbound calls held by them."""
    dep = fake_deployment(workdir / "deployment.json")
    port = free_port(HONEST_SRC)
    with HostilePeer("drip") as rpc, HostilePeer("huge") as kms, \
            HostilePeer("silent") as op:
        cmd = [sys.executable, "-m", "verinfer", "explorer", "--rpc-url", rpc.url,
               "--deployment", str(dep), "--kms", kms.url, "--operator", op.url,
               "--port", str(port)]
        with _process(cmd, port, "/api/status", workdir / "explorer.log") as proc:
            def honest() -> bool:
                status, body = request(HONEST_SRC, port, "GET", "/")
                return _check(status == 200 and b"</html>" in body, status, body)

            yield Service(
                name="explorer", host=HONEST_SRC, port=port, pid=proc.pid,
                health_path="/api/status", honest=honest, data_dir=None,
                body_path="/api/search", max_body_bytes=4 * 1024 * 1024,
                refused=[("GET", "/receipt/0x" + "00" * 32, {}, b""),
                         ("GET", "/api/search?q=" + "z" * 200, {}, b""),
                         ("GET", "/nope", {}, b"")],
                attacks=("slow_body", "slowloris", "oversized", "flood", "idle",
                         "hostile_peers"))


def fake_deployment(path: Path) -> Path:
    """A deployment.json naming contracts that exist nowhere (chain 31337): enough for a
    process to start and call its chain RPC."""
    path.write_text(json.dumps({"chain_id": 31337, "deployed_block": 0,
                                **{k: "0x" + f"{i:02x}" * 20 for i, k in enumerate(
                                    ("protocol_config", "stake_registry", "batch_registry",
                                     "challenge_manager", "audit_log"), start=1)}}))
    return path


def operator_start_against_rpc(model: Path, workdir: Path, mode: str,
                               limit_s: float = 45.0) -> tuple[str, float, int, float]:
    """``verinfer serve`` whose operator directory names a chain RPC that is a
    :class:`HostilePeer` (``mode``): does it come up, or fail with an error, within
    ``limit_s``? Returns ("healthy" | "exited N" | "still starting", seconds, RPC requests
    the peer saw, the process's peak RSS in MB)."""
    opdir = workdir / f"operator-rpc-{mode}"
    with HostilePeer(mode) as rpc:
        r = subprocess.run([sys.executable, "-m", "verinfer", "operator", "init", str(opdir),
                            "--light-kdf", "--unsafe-dev", "--rpc-url", rpc.url,
                            "--deployment", str(fake_deployment(workdir / "deployment.json"))],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"operator init failed: {r.stderr[-2000:]}")
        port = free_port(HONEST_SRC)
        with (workdir / f"operator-rpc-{mode}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "verinfer", "serve", "--model", str(model), "--port",
                 str(port), "--name", "tiny", "--max-context", "512", "--unsafe-dev",
                 "--operator-dir", str(opdir)], stdout=log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        state = "still starting"
        peak = 0.0
        try:
            while time.monotonic() - t0 < limit_s:
                with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                    peak = max(peak, rss_mb(proc.pid))
                if proc.poll() is not None:
                    state = f"exited {proc.returncode}"
                    break
                with contextlib.suppress(OSError, http.client.HTTPException):
                    if request(HONEST_SRC, port, "GET", "/health", timeout=1)[0] == 200:
                        state = "healthy"
                        break
                time.sleep(0.25)
            return state, round(time.monotonic() - t0, 1), rpc.requests, round(peak, 1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def explorer_against_rpc(workdir: Path, mode: str, limit_s: float = 30.0
                         ) -> tuple[str, float, int, float]:
    """``verinfer explorer`` whose chain RPC is a :class:`HostilePeer` (``mode``), for
    ``limit_s``: what its status says at the end (the follower's error, or "no error"), the
    seconds, the RPC requests the peer saw and the process's peak RSS in MB."""
    port = free_port(HONEST_SRC)
    dep = fake_deployment(workdir / "deployment.json")
    with HostilePeer(mode) as rpc:
        cmd = [sys.executable, "-m", "verinfer", "explorer", "--rpc-url", rpc.url,
               "--deployment", str(dep), "--port", str(port)]
        with _process(cmd, port, "/api/status", workdir / f"explorer-rpc-{mode}.log") as proc:
            t0 = time.monotonic()
            peak = 0.0
            while time.monotonic() - t0 < limit_s:
                with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                    peak = max(peak, rss_mb(proc.pid))
                time.sleep(0.25)
            status, body = request(HONEST_SRC, port, "GET", "/api/status")
            error = json.loads(body).get("follower_error") if status == 200 else f"{status}"
            return (str(error)[:120] or "no error", round(time.monotonic() - t0, 1),
                    rpc.requests, round(peak, 1))


_PROXY_MAIN = """
import sys
from verinfer.testing.eigenda_fake_proxy import FakeEigenDAProxy
p = FakeEigenDAProxy().start()
print(p.url, flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def fake_eigenda_service(workdir: Path) -> Iterator[Service]:
    """The fake EigenDA proxy (``verinfer.testing.eigenda_fake_proxy``, a test double) in a
    process of its own, so its memory is measured apart from the attackers'."""
    from verinfer.testing.eigenda_fake_proxy import PROXY_MAX_BODY_BYTES

    with (workdir / "fake-eigenda.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-c", _PROXY_MAIN], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().strip()
        port = int(url.rsplit(":", 1)[1])

        def honest() -> bool:
            blob = secrets.token_bytes(1024)
            status, cert = request(HONEST_SRC, port, "POST", "/put?commitment_mode=standard",
                                   body=blob)
            _check(status == 200, status, cert)
            status, got = request(HONEST_SRC, port, "GET",
                                  f"/get/0x{cert.hex()}?commitment_mode=standard")
            return _check(status == 200 and got == blob, status, got)

        yield Service(
            name="fake_eigenda", host=HONEST_SRC, port=port, pid=proc.pid,
            health_path="/health", honest=honest, data_dir=None,
            body_path="/put?commitment_mode=standard", max_body_bytes=PROXY_MAX_BODY_BYTES,
            refused=[("GET", "/get/0x00?commitment_mode=standard", {}, b""),
                     ("POST", "/put", {}, b"x"), ("GET", "/nope", {}, b"")],
            attacks=("slow_body", "slowloris", "oversized", "flood", "idle"))
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tiny_model(workdir: Path) -> Path:
    """The tests' tiny llama (``engine.tiny``) written to ``workdir``."""
    from verinfer.engine.tiny import write_tiny_llama

    return write_tiny_llama(workdir / "tiny.gguf", seed=0)


def scratch_dir(prefix: str = "verinfer-hostile-") -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
