"""Raw HTTP/1.1 bytes to a loopback service and whatever comes back: for the adversarial tests
that send what no HTTP client library would (conflicting framing headers, a negative
Content-Length, a body that outruns the limit)."""

from __future__ import annotations

import socket
import time


def raw_exchange(base_url: str, request: bytes, body: bytes = b"", *, half_close: bool = False,
                 timeout_s: float = 5.0) -> bytes:
    """Sends ``request`` (head, and anything else the test spells out) then ``body`` in 64 KiB
    pieces to ``base_url`` (``http://host:port``); with ``half_close`` it then shuts its write
    side. Returns every byte the service answered until it closed or ``timeout_s`` passed.
    A service that refuses and closes mid-body is expected: its answer is already on the way,
    so a failed send is not an error here."""
    host, port = base_url.removeprefix("http://").rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        try:
            s.sendall(request)
            for i in range(0, len(body), 1 << 16):
                s.sendall(body[i:i + (1 << 16)])
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out = b""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    return out
