"""The one place a verinfer service makes its web3 provider: every call to a chain RPC has a
whole-call deadline and a cap on the answer's size.

web3's ``HTTPProvider`` reads with requests' per-read timeout and keeps the whole answer in
memory: an RPC that drips a byte every 50 ms held ``verinfer serve`` at start for ever, and a
1 GiB answer took the operator to 2,305 MB RSS (the explorer to 3,180 MB; issue 32,
docs/budgets.md). :func:`bounded_web3` / :func:`bounded_provider` give a provider whose every
call — the status line, headers and body, across web3's own retries — ends within
``deadline_s`` (:class:`RpcDeadlineExceeded`), and whose answer is read in pieces and refused
past ``max_answer_bytes`` (:class:`RpcAnswerTooLarge`; a declared ``Content-Length`` beyond it
is refused before any body is read).

How the deadline holds while a peer drips: each call sets a deadline for its thread; the
connection's response reads its socket through :class:`_DeadlineIO`, which gives each
``recv`` only the time left and raises once none is left. Both errors are
:class:`~verinfer.chain.errors.ChainError` (the node failed) and requests exceptions (callers
that already handle a failed RPC call keep doing so); web3 retries neither.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import ProxyManager
from web3 import Web3
from web3.providers.rpc import HTTPProvider

from verinfer.chain.errors import ChainError, RpcDeadlineError

#: Blocks per eth_getLogs request, for every service that scans logs (the committee node, the
#: operator's claim responder, the client's receipt keeper). Public RPCs refuse wider ranges
#: (10,000 blocks or fewer, some 2,000), and one request over a chain's whole history also
#: outgrows the RPC answer cap (``RPC_MAX_ANSWER_BYTES``): a node that asked for "deployment to
#: latest" stopped working once the chain was 10,000 blocks past the deployment.
LOG_CHUNK_BLOCKS = 2_000
#: Blocks re-read below a scan's cursor at each scan: an event moved by a shallow reorg is still
#: seen (what is read is keyed by id, so reading it twice is harmless).
REORG_OVERLAP_BLOCKS = 12

T = TypeVar("T")


def call_within(what: str, fn: Callable[[], T], deadline_s: float, *,
                thread_name: str = "rpc") -> T:
    """``fn()`` within a whole-call deadline, for a step made of several chain calls (a
    provider's deadline bounds one call: a node trickling answers across calls, or a
    transaction never mined, would still hold the step). Raises :class:`RpcDeadlineError`
    after ``deadline_s``; the call is left to finish in a daemon thread. The operator's claim
    responder and the client's receipt keeper use it."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    t = threading.Thread(target=run, name=f"{thread_name}-{what}", daemon=True)
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        raise RpcDeadlineError(f"{what}: no answer within {deadline_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]

#: Defaults (docs/budgets.md): a whole call within 30 s, an answer of at most 32 MiB.
RPC_DEADLINE_S = 30.0
RPC_MAX_ANSWER_BYTES = 32 * 1024 * 1024
_CHUNK = 64 * 1024


class RpcBoundError(ChainError, requests.exceptions.RequestException):
    """A chain RPC call broke one of its bounds (the node's fault, not the caller's)."""

    code = "rpc_bound_exceeded"

    def __init__(self, message: str) -> None:
        ChainError.__init__(self, message)


class RpcDeadlineExceeded(RpcBoundError):
    """The whole call (connect, headers, body) took longer than its deadline."""

    code = "rpc_deadline_exceeded"

    def __init__(self, url: str, deadline_s: float) -> None:
        super().__init__(f"the chain RPC at {_origin(url)} did not answer within "
                         f"{deadline_s:g} s (whole call)")
        self.deadline_s = deadline_s


class RpcAnswerTooLarge(RpcBoundError):
    """The answer is (or declares itself) larger than the cap."""

    code = "rpc_answer_too_large"

    def __init__(self, url: str, size: int, cap: int) -> None:
        super().__init__(f"the chain RPC at {_origin(url)} answered {size} bytes or more; "
                         f"the limit is {cap}")
        self.size, self.cap = size, cap


def _origin(url: str) -> str:
    """scheme://host[:port] only: a hosted RPC's API key sits in its path or query."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return f"{u.scheme}://{u.hostname}{f':{u.port}' if u.port else ''}"


class _DeadlinePassed(Exception):
    """Raised inside urllib3 (not an OSError, so nothing there retries or rewraps it)."""


_local = threading.local()


def _deadline() -> float | None:
    return getattr(_local, "deadline", None)


@contextlib.contextmanager
def _call_deadline(seconds: float) -> Iterator[float]:
    """A deadline for everything this thread sends inside; an outer one (a whole web3 call
    across its retries) wins over an inner one."""
    outer = _deadline()
    mine = time.monotonic() + seconds
    _local.deadline = mine if outer is None else min(outer, mine)
    try:
        yield _local.deadline
    finally:
        _local.deadline = outer


class _DeadlineIO(socket.SocketIO):
    """The socket as http.client reads it, each ``recv`` given only the time left."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__(sock, "rb")
        sock._io_refs += 1  # type: ignore[attr-defined]  # as socket.makefile does
        self._socket, self._deadline_at = sock, deadline
        self._per_read = sock.gettimeout()

    def readinto(self, b: Any) -> int | None:
        remaining = self._deadline_at - time.monotonic()
        if remaining <= 0:
            raise _DeadlinePassed
        self._socket.settimeout(remaining if self._per_read is None
                              else min(remaining, self._per_read))
        try:
            return super().readinto(b)
        except TimeoutError:
            if self._deadline_at - time.monotonic() <= 0:
                raise _DeadlinePassed from None
            raise


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        deadline = _deadline()
        if deadline is not None:
            self.fp.close()  # the plain reader http.client made (drops its socket reference)
            self.fp = io.BufferedReader(_DeadlineIO(sock, deadline))


class _HTTPConnection(HTTPConnection):
    response_class = _DeadlineResponse


class _HTTPSConnection(HTTPSConnection):
    response_class = _DeadlineResponse


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _DeadlineAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is ProxyManager:  # an HTTP(S) proxy (SOCKS keeps its own pools)
            manager.pool_classes_by_scheme = _POOLS
        return manager


class BoundedSession(requests.Session):
    """A requests session whose every request ends within ``deadline_s`` (or the caller's
    tighter :func:`_call_deadline`) and whose answer holds at most ``max_answer_bytes``
    (decoded), through an HTTP(S) proxy too (``HTTP(S)_PROXY``); through a SOCKS proxy the
    deadline is checked only between 64 KiB pieces of the body."""

    def __init__(self, deadline_s: float = RPC_DEADLINE_S,
                 max_answer_bytes: int = RPC_MAX_ANSWER_BYTES) -> None:
        if deadline_s <= 0 or max_answer_bytes < 1:
            raise ValueError(f"RPC bounds must be positive: deadline_s={deadline_s}, "
                             f"max_answer_bytes={max_answer_bytes}")
        super().__init__()
        self.deadline_s, self.max_answer_bytes = deadline_s, max_answer_bytes
        adapter = _DeadlineAdapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        url = request.url or ""
        with _call_deadline(self.deadline_s) as deadline:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RpcDeadlineExceeded(url, self.deadline_s)
            timeout = kwargs.get("timeout")
            connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
            kwargs["timeout"] = (min(connect or remaining, remaining),
                                 min(read or remaining, remaining))
            kwargs["stream"] = True
            try:
                response = super().send(request, **kwargs)
                try:
                    declared = response.headers.get("Content-Length", "")
                    if declared.isdigit() and int(declared) > self.max_answer_bytes:
                        raise RpcAnswerTooLarge(url, int(declared), self.max_answer_bytes)
                    body = bytearray()
                    for piece in response.raw.stream(_CHUNK, decode_content=True):
                        body += piece
                        if len(body) > self.max_answer_bytes:
                            raise RpcAnswerTooLarge(url, len(body), self.max_answer_bytes)
                        if time.monotonic() > deadline:
                            raise _DeadlinePassed
                except BaseException:
                    response.close()
                    raise
            except _DeadlinePassed:
                raise RpcDeadlineExceeded(url, self.deadline_s) from None
            except requests.exceptions.Timeout as e:
                if time.monotonic() >= deadline and not isinstance(e, RpcBoundError):
                    raise RpcDeadlineExceeded(url, self.deadline_s) from e
                raise
        response._content = bytes(body)
        response._content_consumed = True
        return response


class BoundedHTTPProvider(HTTPProvider):
    """web3's HTTP provider over a :class:`BoundedSession`; the deadline spans each whole
    call, web3's retries of it included."""

    def __init__(self, endpoint_uri: str, *, deadline_s: float = RPC_DEADLINE_S,
                 max_answer_bytes: int = RPC_MAX_ANSWER_BYTES, **kwargs: Any) -> None:
        self.deadline_s = deadline_s
        kwargs.setdefault("request_kwargs", {"timeout": deadline_s})
        super().__init__(endpoint_uri, session=BoundedSession(deadline_s, max_answer_bytes),
                         **kwargs)

    def _make_request(self, method: Any, request_data: bytes) -> bytes:
        with _call_deadline(self.deadline_s):
            return super()._make_request(method, request_data)

    def make_batch_request(self, *args: Any, **kwargs: Any) -> Any:
        with _call_deadline(self.deadline_s):
            return super().make_batch_request(*args, **kwargs)


def bounded_provider(rpc_url: str, *, deadline_s: float = RPC_DEADLINE_S,
                     max_answer_bytes: int = RPC_MAX_ANSWER_BYTES,
                     **kwargs: Any) -> BoundedHTTPProvider:
    """The provider every verinfer service uses for its chain RPC (``kwargs``: web3's, e.g.
    ``exception_retry_configuration``)."""
    return BoundedHTTPProvider(rpc_url, deadline_s=deadline_s,
                               max_answer_bytes=max_answer_bytes, **kwargs)


def bounded_web3(rpc_url: str, *, deadline_s: float = RPC_DEADLINE_S,
                 max_answer_bytes: int = RPC_MAX_ANSWER_BYTES, **kwargs: Any) -> Web3:
    """``Web3`` over :func:`bounded_provider`."""
    return Web3(bounded_provider(rpc_url, deadline_s=deadline_s,
                                 max_answer_bytes=max_answer_bytes, **kwargs))
