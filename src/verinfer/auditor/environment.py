"""Step 5: is the auditor's machine the environment the receipt names?

- the weights: a model file whose sha256 is the receipt's model id (the auditor brings the
  file: ``--model FILE`` or a shipped model's name; only files are hashed, nothing is fetched);
- the tokenizer: the hash the ExecRequest names must be this model's (the model id fixes it);
- the engine fingerprint: the ExecRequest carries the operator's *approved* fingerprint (the
  JSON whose sha256 is the receipt's engineFingerprintHash). Each field that differs from this
  machine's is listed with whether it can change a bit (engine/fingerprint.py): the sampling
  rule, kernel mode, summation order, dtype, backend and fingerprint version do; the hardware
  class does only when one side is not ``any``; the pinned image digest names *where* the code
  came from, not an arithmetic rule (a different digest with the same rules is reported, not
  refused). The ISA path the kernels dispatched to is never hashed and never matters for the
  invariant kernels — that is what `--kernel-isa` lets an auditor show.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verinfer.engine.loader import resolve_model_path, sha256_file
from verinfer.errors import VerinferError
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted

#: Approved fingerprint fields whose difference changes output bits (refuse to replay).
BIT_DECIDING = ("version", "backend", "kernels", "linear_order", "sampler", "dtype")
#: Fields that identify, but do not define, the arithmetic (reported, replay goes on).
PROVENANCE = ("container_digest",)


@dataclass(frozen=True)
class FieldDiff:
    field: str
    receipt: Any
    local: Any
    matters: bool
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "receipt": self.receipt, "local": self.local,
                "matters": self.matters, "why": self.why}


def find_model(model_id: bytes, candidates: list[str]) -> tuple[Path | None, list[str]]:
    """(the file among ``candidates`` — paths or shipped names — whose sha256 is
    ``model_id``, what each candidate hashed to or why it could not be read)."""
    seen: list[str] = []
    for spec in candidates:
        try:
            path = resolve_model_path(spec)
            mid = sha256_file(path) if path.is_file() else None
        except (OSError, VerinferError) as e:
            seen.append(f"{spec}: unreadable ({getattr(e, 'message', None) or e})"[:200])
            continue
        if mid is None:
            seen.append(f"{spec}: no such file")
        elif mid == model_id:
            return path, seen
        else:
            seen.append(f"{spec}: 0x{mid.hex()[:16]}…")
    return None, seen


def fingerprint_diffs(receipt_fp: str, local_fp: dict[str, Any]) -> list[FieldDiff]:
    """Fields of the receipt's approved fingerprint that differ from this engine's."""
    try:  # the operator's string: a nesting bomb must not crash the auditor
        theirs = loads_untrusted(receipt_fp, what="the receipt's engine fingerprint")
    except UntrustedJsonError:
        theirs = None
    if not isinstance(theirs, dict):
        return [FieldDiff("engine_fingerprint", receipt_fp[:200], "", True,
                          "the receipt's fingerprint is not a fingerprint JSON object")]
    out = []
    for name in sorted(set(theirs) | set(local_fp)):
        a, b = theirs.get(name), local_fp.get(name)
        if a == b:
            continue
        if name in BIT_DECIDING:
            out.append(FieldDiff(name, a, b, True, "decides the output bits"))
        elif name == "hardware_class":
            matters = a != "any" or b != "any"
            out.append(FieldDiff(name, a, b, matters,
                                 "machine-dependent kernels: bits depend on the hardware"
                                 if matters else "invariant kernels: any hardware"))
        elif name in PROVENANCE:
            out.append(FieldDiff(name, a, b, False,
                                 "the pinned image names where the code came from; the "
                                 "arithmetic is fixed by the fields above"))
        else:
            out.append(FieldDiff(name, a, b, True, "an approved field this build does not "
                                 "know: treated as bit-deciding"))
    return out
