"""A direct GGUF (v2/v3) reader: metadata key/values and tensor directory over one mmap.

``gguf.GGUFReader`` maps every array item as its own numpy view, which takes ~20 s for a
262k-token vocabulary; this parser reads the same file in well under a second and leaves
dequantization to ``gguf.quants``. Layout: magic, version, n_tensors, n_kv, then the key/values,
then per tensor (name, n_dims, dims[ne0 first], type, offset), then aligned tensor data.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF file."""


_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: rows first (GGUF stores ne0 = the last axis first)
    qtype: int  # gguf.GGMLQuantizationType value
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass
class GGUFFile:
    fields: dict[str, Any]
    tensors: list[TensorInfo]
    data: np.ndarray  # the whole file as uint8 (memory-mapped, read-only)

    def raw(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes as uint8 rows: [rows, bytes_per_row]."""
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        return self.data[t.offset:t.offset + t.nbytes].reshape(rows, -1)


class _Cursor:
    def __init__(self, buf: Any) -> None:
        self.buf, self.pos = buf, 0

    def u32(self) -> int:
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self) -> int:
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def string(self) -> str:
        n = self.u64()
        if self.pos + n > len(self.buf):
            raise GGUFFormatError("string runs past the end of the file")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="surrogateescape")
        self.pos += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.u32(), self.u64()
            if etype == 8:
                return [self.string() for _ in range(count)]
            if etype == 9:
                return [self.value(9) for _ in range(count)]
            code = _SCALAR.get(etype)
            if code is None:
                raise GGUFFormatError(f"unknown GGUF array element type {etype}")
            size = struct.calcsize(code) * count
            if self.pos + size > len(self.buf):
                raise GGUFFormatError("array runs past the end of the file")
            vals = list(struct.unpack_from(f"<{count}{code}", self.buf, self.pos))
            self.pos += size
            return vals
        code = _SCALAR.get(vtype)
        if code is None:
            raise GGUFFormatError(f"unknown GGUF value type {vtype}")
        (v,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += struct.calcsize(code)
        return v


def read_gguf(path: str | os.PathLike[str], *, tensors: bool = True) -> GGUFFile:
    """Parse ``path``; raises GGUFFormatError (or OSError) on anything malformed."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # empty file
            raise GGUFFormatError("empty file") from e
    try:
        cur = _Cursor(mm)
        if mm[:4] != b"GGUF":
            raise GGUFFormatError("bad magic (not a GGUF file)")
        cur.pos = 4
        version = cur.u32()
        if version not in (2, 3):
            raise GGUFFormatError(f"unsupported GGUF version {version}")
        n_tensors, n_kv = cur.u64(), cur.u64()
        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            fields[key] = cur.value(cur.u32())
        infos: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors if tensors else 0):
            name = cur.string()
            dims = [cur.u64() for _ in range(cur.u32())]
            qtype, offset = cur.u32(), cur.u64()
            infos.append((name, tuple(reversed(dims)), qtype, offset))
        align = int(fields.get("general.alignment", 32))
        start = (cur.pos + align - 1) // align * align
        out: list[TensorInfo] = []
        for name, shape, qtype, offset in infos:
            try:
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
            except (ValueError, KeyError) as e:
                raise GGUFFormatError(f"tensor {name!r} has unknown type {qtype}") from e
            n = int(np.prod(shape))
            if n % block:
                raise GGUFFormatError(f"tensor {name!r}: {n} elements is not whole blocks")
            t = TensorInfo(name, shape, qtype, start + offset, n // block * size)
            if t.offset + t.nbytes > len(mm):
                raise GGUFFormatError(f"tensor {name!r} runs past the end of the file "
                                      "(truncated?)")
            out.append(t)
        data = np.frombuffer(mm, dtype=np.uint8)
    except (struct.error, UnicodeDecodeError, IndexError, OverflowError) as e:
        raise GGUFFormatError(f"corrupt GGUF: {e}") from e
    return GGUFFile(fields, out, data)
