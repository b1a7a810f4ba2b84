"""Running hash over streamed output, so the final SSE chunk can carry a receipt for exactly
the bytes the client received.

Decision: ExecResult carries ``text_sha256`` = sha256 of the UTF-8 output text. A streaming
server feeds every ``delta.content`` it sends, in order, to :class:`StreamHasher`; a client does
the same with what it receives. Chunk boundaries do not matter (plain sha256 over the
concatenation), so a delta may split a multi-byte character or a proxy may re-chunk. The hash
covers content, not SSE framing: framing (ids, timestamps) is not reproducible by verifiers,
while the content is, so the same out_hash works for client checks and committee votes.
"""

from __future__ import annotations

import hashlib

from verinfer.protocol.hexutil import to_hex


class StreamHasher:
    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.n_bytes = 0

    def update(self, chunk: bytes | str) -> None:
        data = chunk.encode() if isinstance(chunk, str) else chunk
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"StreamHasher.update takes bytes or str, got {type(chunk).__name__}")
        self._h.update(data)
        self.n_bytes += len(data)

    def digest(self) -> bytes:
        """Digest of everything so far; more chunks may follow."""
        return self._h.copy().digest()

    def hexdigest(self) -> str:
        return to_hex(self.digest())
