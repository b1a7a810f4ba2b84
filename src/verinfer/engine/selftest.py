"""The determinism self-test a backend must pass before an operator signs under it.

The protocol's first property — same request, same bytes, alone or under load — is a claim
about the backend on *this* machine. The own engine proves it by construction (fixed-order
kernels, docs/engine.md); a backend such as vLLM can only be measured. The self-test measures
it, through the same interface the operator serves with:

* every probe prompt (three lengths: short, medium, long enough to be prefilled in several
  chunks) runs ALONE first: the reference;
* then inside concurrent batches of several sizes, at a different place each time, next to
  fillers of other lengths — so its prefill is chunked differently and it shares steps with
  other sequences;
* greedy and seeded sampling; every comparison is of token ids, of every step's logit digest
  (all bits of the float32 logits row) and of the committed logprobs (top 5);
* replay: whether ``replay`` over prompt + output reproduces the decode (tokens, digests).
  For the own engine that is one prefill pass, which verifiers then use instead of decoding;
  the vLLM backend re-decodes (it does not expose a prefill's logits rows), and records it.

The first differing case is named in the report. The report is a JSON document; the operator
keeps it with its state and shows its summary in /health (operator/runtime.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verinfer.engine.divergence import first_divergence
from verinfer.engine.engine import Engine, GenerationResult
from verinfer.protocol.hexutil import to_hex
from verinfer.protocol.sampling_params import SamplingParams

REPORT_VERSION = 1
_TEXTS = (
    "The capital of France is",
    "Deterministic inference means that the same request always produces the same bytes. "
    "An operator signs each answer, and a verifier who re-executes it compares",
    ("Reproducibility suffers at every boundary: floating-point addition is not associative, "
     "thread scheduling is nondeterministic, and batching changes the order of reductions. ")
    * 4 + "Therefore",
)
_FILLER = ("Once upon a time", "A list of prime numbers: 2, 3, 5, 7,",
           "In 1969 the first humans walked on the Moon, and the world watched as")
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, top_k=40, seed=20261124, max_tokens=8)
BATCH_SIZES = (4, 8)
TOP_LOGPROBS = 5


class SelfTestFailedError(RuntimeError):
    """The backend is not deterministic enough to sign under (the report says where)."""


@dataclass
class Case:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class SelfTestReport:
    version: int
    backend: str
    # a JSON document (kept on disk, summarised in /health): identities as 0x-hex text
    fingerprint_hash: str
    fingerprint: dict[str, Any]
    model_id: str
    passed: bool
    cases: list[Case]
    replay_reproduces_decode: bool
    verification: str  # "replay" (one prefill) or "re-decode"
    seconds: float
    first_failure: str | None = None
    reported: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """What /health shows."""
        return {"passed": self.passed, "cases": len(self.cases),
                "failed": sum(not c.passed for c in self.cases),
                "first_failure": self.first_failure, "verification": self.verification,
                "replay_reproduces_decode": self.replay_reproduces_decode,
                "fingerprint_hash": self.fingerprint_hash}

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return p


def _compare(ref: GenerationResult, got: GenerationResult) -> str:
    """'' when equal in every committed byte, else where they first differ."""
    a, b = ref.token_ids, got.token_ids
    first = first_divergence(a, b)
    if first is not None:
        return f"token ids differ from step {first}: {a[first:first + 3]} vs {b[first:first + 3]}"
    for i, (x, y) in enumerate(zip(ref.step_digests, got.step_digests, strict=True)):
        if x != y:
            return f"same tokens, logits bits differ at step {i}"
    if ref.logprobs != got.logprobs:
        return "same tokens and logits digests, different logprobs"
    if ref.text != got.text or ref.finish_reason != got.finish_reason:
        return "same tokens, different text or finish reason"
    return ""


def _prompts(engine: Engine) -> tuple[list[list[int]], list[list[int]]]:
    tok = engine.tokenizer
    bos = tok.spec.add_bos

    def enc(t: str) -> list[int]:
        return tok.encode(t, add_bos=bos)

    return [enc(t) for t in _TEXTS], [enc(t) for t in _FILLER]


def _batch(engine: Engine, probe: list[int], params: SamplingParams, fillers: list[list[int]],
           size: int, at: int) -> GenerationResult:
    """``probe`` submitted at index ``at`` of ``size`` concurrent requests; its result."""
    futs: list[Future[GenerationResult]] = []
    for k in range(size):
        if k == at:
            futs.append(engine.submit(probe, params, top_logprobs=TOP_LOGPROBS))
        else:
            filler = fillers[k % len(fillers)]
            fp = SamplingParams(temperature=0.7, seed=k, max_tokens=4 + (k % 5))
            futs.append(engine.submit(filler, fp))
    results = [f.result() for f in futs]
    return results[at]


def run_selftest(engine: Engine, *, batch_sizes: Sequence[int] = BATCH_SIZES
                 ) -> SelfTestReport:
    """Runs every case (it does not stop at the first failure) and returns the report."""
    t0 = time.monotonic()
    probes, fillers = _prompts(engine)
    cases: list[Case] = []
    refs: dict[tuple[int, str], GenerationResult] = {}
    for pi, probe in enumerate(probes):
        for mode, params in (("greedy", GREEDY), ("seeded", SEEDED)):
            ref = engine.generate(probe, params, top_logprobs=TOP_LOGPROBS)
            refs[(pi, mode)] = ref
            again = engine.generate(probe, params, top_logprobs=TOP_LOGPROBS)
            diff = _compare(ref, again)
            cases.append(Case(f"prompt{pi}[{len(probe)} tok]/{mode}/alone-twice", not diff,
                              diff))
            for size in batch_sizes:
                at = (pi + size) % size
                got = _batch(engine, probe, params, fillers + probes, size, at)
                diff = _compare(ref, got)
                cases.append(Case(f"prompt{pi}[{len(probe)} tok]/{mode}/batch{size}@{at}",
                                  not diff, diff))
    replay_ok = True
    prefill_probe = getattr(engine, "prefill_reproduces_decode", None)
    if prefill_probe is not None:  # a backend whose replay re-decodes: test a real prefill apart
        prefill_ok = True
        for pi, prompt in enumerate(probes):
            ok, detail = prefill_probe(prompt, GREEDY.max_tokens)
            prefill_ok = prefill_ok and ok
            cases.append(Case(f"prompt{pi}/greedy/one-prefill-vs-decode", True,
                              "" if ok else f"informational: {detail}"))
    for (pi, mode), ref in refs.items():
        params = GREEDY if mode == "greedy" else SEEDED
        rr = engine.replay(probes[pi], ref.token_ids, params, top_logprobs=TOP_LOGPROBS)
        ok = (rr.matches and rr.step_digests == ref.step_digests
              and rr.logprobs == ref.logprobs)
        detail = "" if ok else (f"replay mismatch at step {rr.first_mismatch}" if not rr.matches
                                else "replay tokens match, logits bits or logprobs differ")
        replay_ok = replay_ok and ok
        cases.append(Case(f"prompt{pi}/{mode}/replay", ok, detail))
    failed = [c for c in cases if not c.passed]
    fp = engine.fingerprint
    own_prefill = prefill_probe is None  # the own engine's replay is one prefill pass
    if prefill_probe is not None:
        replay_ok = prefill_ok
    return SelfTestReport(
        version=REPORT_VERSION, backend=fp.backend, fingerprint_hash=to_hex(fp.hash),
        fingerprint=fp.approved(), model_id=to_hex(engine.model_id), passed=not failed,
        cases=cases,
        replay_reproduces_decode=replay_ok,
        verification="replay" if own_prefill and replay_ok else "re-decode",
        seconds=round(time.monotonic() - t0, 2),
        first_failure=(f"{failed[0].name}: {failed[0].detail}" if failed else None),
        reported=dict(fp.reported))


def load_report(path: str | Path) -> SelfTestReport | None:
    """A kept report, or None when there is none readable (then the self-test runs again)."""
    try:
        doc = json.loads(Path(path).read_text())
        # anything but a well-typed report is no report (a list has no .get; "false" is truthy)
        if not isinstance(doc, dict) or doc.get("version") != REPORT_VERSION \
                or type(doc.get("passed")) is not bool:
            return None
        doc["cases"] = [Case(**c) for c in doc["cases"]]
        return SelfTestReport(**doc)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def require_pass(report: SelfTestReport) -> None:
    if not report.passed:
        raise SelfTestFailedError(
            f"the {report.backend} backend failed the determinism self-test "
            f"({sum(not c.passed for c in report.cases)} of {len(report.cases)} cases; first: "
            f"{report.first_failure}): it must not sign receipts on this machine")
