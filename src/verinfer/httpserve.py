"""What every verinfer HTTP service needs against hostile clients, in one place.

- :class:`BodyGuard`, an ASGI middleware: a request body must arrive whole within
  ``body_deadline_s`` of its headers (else 408), hold at most ``max_body_bytes`` (413, checked
  on Content-Length up front and on the bytes received), and all bodies of requests in progress
  together at most ``max_inflight_body_bytes`` (503). A request with both Content-Length and
  Transfer-Encoding is refused (400 ``ambiguous_framing``: request smuggling behind a proxy
  that frames by length). A refused request's connection is closed. One client address may
  hold at most ``max_inflight_body_bytes_per_client`` of those bodies (503 past it; default a
  quarter of the total, at least one largest body): one address's 16 stalled 4 MiB bodies took
  the operator's whole 64 MiB and every other client got 503 for the body deadline (issue 32).
  Why: a client that declares N bytes, sends N-1 and goes silent held its buffer for ever —
  30 such connections took the operator from 307 to 565 MB (issue 32.9).
- :func:`server_config`, the uvicorn settings: a cap on connections (``limit_concurrency``:
  past it requests get 503), a deadline for a request's headers (uvicorn has none: a client
  sending headers a byte at a time held its connection indefinitely), the keep-alive timeout,
  and proxy headers (``X-Forwarded-For``) trusted only from the configured proxies — none by
  default. uvicorn's own default trusts them from 127.0.0.1, so a client on the same host (or
  behind any local forwarder) chose its own address and reset per-address rate limits
  (issue 32.7). And a cap on open connections per client address
  (``max_connections_per_client``, past it a 503 and the connection closed before anything is
  read; a trusted proxy's connections are not counted, its clients' bodies are, by their
  forwarded address): 600 idle connections from one address took all 512 of the operator's
  slots and every other client got 503 until the header deadline freed them (issue 32).

This module imports nothing of verinfer (layer 0, docs/architecture.md): the operator, the KMS
shard and the explorer can all use it. Each service passes its own error body
(``error_body``); the default is OpenAI's ``{"error": {...}}`` shape.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

#: Defaults (docs/budgets.md): a body must arrive within 30 s (4 MiB at >= 140 KB/s), headers
#: within 10 s, 64 MiB of bodies in progress at once, 512 connections.
BODY_DEADLINE_S = 30.0
HEADER_DEADLINE_S = 10.0
MAX_INFLIGHT_BODY_BYTES = 64 * 1024 * 1024
MAX_CONNECTIONS = 512
KEEP_ALIVE_S = 5
#: Open connections one client address may hold (a trusted proxy's are not counted).
MAX_CONNECTIONS_PER_CLIENT = 32

#: ``scope`` key set on a request the guard answered itself (status): an inner metrics
#: middleware can leave it to ``on_refuse``.
REFUSED = "verinfer.httpserve.refused"

ErrorBody = Callable[[int, str, str], bytes]


def openai_error(status: int, message: str, code: str) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": code}}).encode()


@dataclass(frozen=True)
class ServeLimits:
    """One service's HTTP bounds (docs/budgets.md lists each service's values)."""

    max_body_bytes: int
    body_deadline_s: float = BODY_DEADLINE_S
    header_deadline_s: float = HEADER_DEADLINE_S
    max_inflight_body_bytes: int = MAX_INFLIGHT_BODY_BYTES
    max_connections: int = MAX_CONNECTIONS
    keep_alive_s: int = KEEP_ALIVE_S
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    #: None: max(max_body_bytes, max_inflight_body_bytes // 4)
    max_inflight_body_bytes_per_client: int | None = None

    def __post_init__(self) -> None:
        if min(self.max_body_bytes, self.max_inflight_body_bytes, self.max_connections,
               self.keep_alive_s, self.max_connections_per_client,
               self.client_body_share) < 1 or min(self.body_deadline_s,
                                                  self.header_deadline_s) <= 0:
            raise ValueError(f"every HTTP limit must be positive: {self}")

    @property
    def client_body_share(self) -> int:
        """Bytes of bodies in progress one client address may hold."""
        if self.max_inflight_body_bytes_per_client is not None:
            return self.max_inflight_body_bytes_per_client
        return min(self.max_inflight_body_bytes,
                   max(self.max_body_bytes, self.max_inflight_body_bytes // 4))


class _Inflight:
    """Body bytes of requests in progress, in total and per client address (one event loop:
    no lock needed)."""

    def __init__(self, cap: int, per_client: int) -> None:
        self.cap, self.per_client, self.held = cap, per_client, 0
        self.by_client: dict[str, int] = {}

    def take(self, client: str, n: int) -> bool:
        mine = self.by_client.get(client, 0)
        if self.held + n > self.cap or mine + n > self.per_client:
            return False
        self.held += n
        if n:
            self.by_client[client] = mine + n
        return True

    def give(self, client: str, n: int) -> None:
        self.held -= n
        left = self.by_client.get(client, 0) - n
        if left > 0:
            self.by_client[client] = left
        else:
            self.by_client.pop(client, None)


class BodyGuard:
    """Pure ASGI middleware (wrap the whole app with it, outside anything that reads bodies).
    ``on_refuse(status)`` is told of each request it answers itself (metrics)."""

    def __init__(self, app: Any, limits: ServeLimits, *, error_body: ErrorBody = openai_error,
                 on_refuse: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app, self.limits, self.error_body = app, limits, error_body
        self.on_refuse, self.clock = on_refuse, clock
        self.inflight = _Inflight(limits.max_inflight_body_bytes, limits.client_body_share)

    async def _answer(self, scope: Any, send: Any, status: int, message: str,
                      code: str) -> None:
        scope[REFUSED] = status
        if self.on_refuse is not None:
            self.on_refuse(status)
        body = self.error_body(status, message, code)
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]
        if status == 503:
            headers.append((b"retry-after", b"1"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lim = self.limits
        declared: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit():
                declared = int(value)
            elif name == b"transfer-encoding":
                chunked = True
        if declared is not None and chunked:
            # h11 frames such a request by Transfer-Encoding and kept the connection for the
            # next one: a front proxy framing by Content-Length saw another request boundary
            # (CL.TE desync). RFC 9112 §6.1: refuse it, and close the connection (_answer).
            await self._answer(scope, send, 400, "a request may not carry both Content-Length "
                               "and Transfer-Encoding", "ambiguous_framing")
            return
        if declared is not None and declared > lim.max_body_bytes:
            await self._answer(scope, send, 413, f"request body of {declared} bytes exceeds "
                               f"the limit of {lim.max_body_bytes}", "request_too_large")
            return
        held = declared or 0
        # the peer, or the forwarded address where uvicorn trusted the proxy that sent it
        client = str((scope.get("client") or ("",))[0])
        if not self.inflight.take(client, held):
            await self._answer(scope, send, 503, "too many request bodies in progress; retry "
                               "shortly", "server_busy")
            return
        deadline = self.clock() + lim.body_deadline_s
        received = 0
        complete = declared == 0
        started = refused = False

        async def refuse(status: int, message: str, code: str) -> dict[str, Any]:
            nonlocal refused
            refused = True
            if not started:
                await self._answer(scope, send, status, message, code)
            return {"type": "http.disconnect"}  # to the app: the client is gone

        async def guarded_receive() -> Any:
            nonlocal received, complete, held
            if refused:
                return {"type": "http.disconnect"}
            if complete:  # the body is in: what follows is a disconnect, whenever it comes
                return await receive()
            remaining = deadline - self.clock()
            try:
                if remaining <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), remaining)
            except TimeoutError:
                return await refuse(408, f"the request body did not arrive within "
                                    f"{lim.body_deadline_s:g} s", "request_timeout")
            if message["type"] == "http.request":
                n = len(message.get("body", b""))
                received += n
                if received > lim.max_body_bytes:
                    return await refuse(413, f"request body exceeds the limit of "
                                        f"{lim.max_body_bytes} bytes", "request_too_large")
                if received > held:  # chunked (or short of what it declared): charged as read
                    if not self.inflight.take(client, received - held):
                        return await refuse(503, "too many request bodies in progress; "
                                            "retry shortly", "server_busy")
                    held = received
                if not message.get("more_body", False):
                    complete = True
            return message

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if refused:
                return  # answered already: whatever the app says after is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        finally:
            self.inflight.give(client, held)


def redact_url(text: str, url: str) -> str:
    """``text`` with the parts of ``url`` that may carry a credential — user info, path, query,
    fragment, as given and percent-decoded — replaced by ``…``; the scheme, host and port stay.
    For errors a service shows to others about its peers (a hosted chain RPC's API key is in its
    URL's path or query, and requests spells both in its exceptions)."""
    if not url:
        return text
    u = urlsplit(url)
    secrets = {u.netloc.rpartition("@")[0] if "@" in u.netloc else "",
               u.path if u.path not in ("", "/") else "", u.query, u.fragment}
    secrets |= {unquote(x) for x in secrets}
    for part in sorted((x for x in secrets if x), key=len, reverse=True):
        text = text.replace(part, "…")
    return text


#: A URL in free text: scheme, optional user info, host[:port], then whatever follows.
_URL = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^\s/@'\"]*@)?([^\s/?#'\"]+)([^\s'\")]*)")
#: requests/urllib3 spell the request's path and query as "... with url: /v2/KEY?x=y (Caused".
_WITH_URL = re.compile(r"(with url: )\S+")


def redact_urls(text: str) -> str:
    """``text`` with every URL cut to scheme://host[:port]… and requests' ``with url: …`` part
    blanked: for error text a service shows to others when the URL it came from is not known
    here (a readiness reason, a 503 message)."""
    text = _WITH_URL.sub(r"\1…", text)
    return _URL.sub(lambda m: m.group(1) + m.group(2) + ("…" if m.group(3) or "@" in m.group(0)
                                                          else ""), text)


def _trusted(peer: str, proxies: Sequence[str]) -> bool:
    """Whether ``peer`` is one of ``proxies`` (addresses, networks, or ``*``)."""
    for entry in proxies:
        if entry in ("*", peer):
            return True
        try:
            if ipaddress.ip_address(peer) in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


#: what a connection past its address's cap is told before it is closed
_TOO_MANY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
             b"connection: close\r\nretry-after: 1\r\ncontent-length: %d\r\n\r\n")


def header_deadline_protocol(seconds: float, *, max_per_client: int | None = None,
                             trusted_proxies: Sequence[str] = (),
                             error_body: ErrorBody = openai_error) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers: counted from the
    connection's start, and from the end of each response for the next request; a connection
    whose headers are not complete by then is closed (uvicorn's keep-alive timer stops at the
    first byte, so a byte every few seconds held a connection indefinitely).

    With ``max_per_client``, a peer address holding that many open connections has its next
    one answered 503 and closed before anything is read (``trusted_proxies`` are not counted:
    every client behind them shares their address). Each call makes a class with its own
    count: one per server."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    open_by_peer: dict[str, int] = {}
    body = error_body(503, f"too many connections from one address (at most "
                           f"{max_per_client}); retry shortly", "too_many_connections")
    refusal = _TOO_MANY % len(body) + body

    class HeaderDeadlineH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _counted: str | None = None

        def _arm_header_deadline(self) -> None:
            self._cancel_header_deadline()
            self._header_timer = self.loop.call_later(seconds, self._header_deadline_passed)

        def _cancel_header_deadline(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_deadline_passed(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            addr = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if max_per_client is not None and addr and not _trusted(addr, trusted_proxies):
                if open_by_peer.get(addr, 0) >= max_per_client:
                    transport.write(refusal)
                    transport.close()
                    return
                open_by_peer[addr] = open_by_peer.get(addr, 0) + 1
                self._counted = addr
            self._arm_header_deadline()

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:  # a request's headers are in
                self._cancel_header_deadline()

        def on_response_complete(self) -> None:
            self._arm_header_deadline()  # before: a pipelined request starts inside
            super().on_response_complete()

        def _release(self) -> None:
            self._cancel_header_deadline()
            if self._counted is not None:
                left = open_by_peer.get(self._counted, 0) - 1
                if left > 0:
                    open_by_peer[self._counted] = left
                else:
                    open_by_peer.pop(self._counted, None)
                self._counted = None

        def handle_websocket_upgrade(self, event: Any) -> None:
            self._release()  # the transport goes to another protocol: this one never hears of it
            super().handle_websocket_upgrade(event)

        def connection_lost(self, exc: Exception | None) -> None:
            self._release()
            super().connection_lost(exc)

    return HeaderDeadlineH11


def server_config(app: Any, host: str, port: int, limits: ServeLimits, *,
                  trusted_proxies: Sequence[str] = (), log_level: str = "warning",
                  access_log: bool = True, error_body: ErrorBody = openai_error) -> Any:
    """The ``uvicorn.Config`` of a verinfer service: ``limits`` applied (connections per client
    address included), and X-Forwarded-For / X-Forwarded-Proto trusted only from
    ``trusted_proxies`` (addresses or networks; none by default: the client address is the
    peer's). Run it with ``uvicorn.Server(config).run()``."""
    import uvicorn

    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log,
        http=header_deadline_protocol(limits.header_deadline_s,
                                      max_per_client=limits.max_connections_per_client,
                                      trusted_proxies=trusted_proxies, error_body=error_body),
        proxy_headers=bool(trusted_proxies), forwarded_allow_ips=list(trusted_proxies),
        limit_concurrency=limits.max_connections, timeout_keep_alive=limits.keep_alive_s)


def serve_app(app: Any, host: str, port: int, limits: ServeLimits, *,
          trusted_proxies: Sequence[str] = (), log_level: str = "warning",
          access_log: bool = True, error_body: ErrorBody = openai_error) -> None:
    """Runs ``app`` under :func:`server_config` until interrupted (what ``uvicorn.run`` does)."""
    import uvicorn

    uvicorn.Server(server_config(app, host, port, limits, trusted_proxies=trusted_proxies,
                                 log_level=log_level, access_log=access_log,
                                 error_body=error_body)).run()
