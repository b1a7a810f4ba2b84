"""A model's weights as the loader holds them and the model families read them.

Its own module, below both: the loader (engine/loader.py) builds a :class:`Weights` and the
families (engine/models/*) read it, and the loader finds a family through the registry, so the
type cannot live in either without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from verinfer.engine.ops import Matrix
from verinfer.errors import ModelLoadError


@dataclass
class Weights:
    """fp32 tensors by GGUF name, plus the raw blocks of matrices kept quantized:
    ``blocks[name] = (GGUF type name, uint8 [N, row bytes])``."""

    f32: dict[str, torch.Tensor]
    blocks: dict[str, tuple[str, torch.Tensor]] = field(default_factory=dict)

    def matrix(self, name: str) -> Matrix:
        if name in self.blocks:
            qtype, raw = self.blocks[name]
            return Matrix(self.f32.get(name), qtype=qtype, blocks=raw)
        if name not in self.f32:
            raise ModelLoadError(f"weight {name!r} is missing from the model file")
        return Matrix(self.f32[name])

    def _of_type(self, qtype: str) -> dict[str, torch.Tensor]:
        return {n: raw for n, (t, raw) in self.blocks.items() if t == qtype}

    @property
    def q8_0(self) -> dict[str, torch.Tensor]:
        """The Q8_0 matrices' raw blocks (a view of ``blocks``)."""
        return self._of_type("Q8_0")

    @property
    def q4_1(self) -> dict[str, torch.Tensor]:
        """The Q4_1 matrices' raw blocks (a view of ``blocks``)."""
        return self._of_type("Q4_1")

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.f32[name]
        except KeyError:
            raise ModelLoadError(f"weight {name!r} is missing from the model file") from None
