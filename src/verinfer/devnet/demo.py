"""`verinfer devnet demo`: the whole protocol in one command, on real processes.

devnet up → a few requests through the official openai SDK → each answer's verification
(receipt id, signer recovered with eth-account, DA pointer) → the operator's batch committed on
chain → one full challenge of one receipt → the committee's verdict (dismissed, bond to the
committee) → a summary → devnet down (unless ``--keep``).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from openai import OpenAI
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from verinfer.chain.structs import ETHER, Status
from verinfer.devnet.harness import Devnet, DevnetStateError
from verinfer.devnet.lifecycle import start, stop
from verinfer.devnet.progress import Steps

#: By default the devnet serves both shipped models: the instruction-tuned SmolLM2 answers
#: chat, the Gemma 3 270M base model (which continues text well, chats poorly) completions.
CHAT_MODEL, COMPLETION_MODEL = "smollm2-135m-instruct", "gemma3-270m"
COMPLETION_PROMPTS = ("The capital of France is", "The lighthouse keeper opened the door and")
CHAT_PROMPT = "In one sentence, what is a lighthouse?"


@dataclass
class Answer:
    kind: str
    prompt: str
    text: str
    verification: dict[str, Any]
    signer: str = ""
    model: str = ""


@dataclass
class DemoResult:
    answers: list[Answer] = field(default_factory=list)
    challenge_id: int = 0
    status: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    credited: dict[str, int] = field(default_factory=dict)
    majority_matches_receipt: bool = False


def ask(dn: Devnet, max_tokens: int) -> list[Answer]:
    """A greedy completion, a streamed seeded completion and a seeded chat, through the
    openai SDK."""
    client = OpenAI(base_url=dn.operator_url + "/v1", api_key="devnet", max_retries=0,
                    timeout=300)
    served = [m.id for m in client.models.list().data]
    # each request to the model made for it when the devnet serves it (--model tiny: one)
    chat_model = CHAT_MODEL if CHAT_MODEL in served else served[0]
    model = COMPLETION_MODEL if COMPLETION_MODEL in served else served[0]
    out: list[Answer] = []
    c = client.completions.create(model=model, prompt=COMPLETION_PROMPTS[0],
                                  max_tokens=max_tokens, temperature=0)
    out.append(Answer("completion (greedy)", COMPLETION_PROMPTS[0], c.choices[0].text,
                      dict((c.model_extra or {})["verification"])))
    text, last = "", None
    for chunk in client.completions.create(model=model, prompt=COMPLETION_PROMPTS[1],
                                           max_tokens=max_tokens, seed=11, temperature=0.8,
                                           stream=True):
        if chunk.choices:
            text += chunk.choices[0].text
        last = chunk
    assert last is not None
    out.append(Answer("completion (stream, seed 11)", COMPLETION_PROMPTS[1], text,
                      dict((last.model_extra or {})["verification"])))
    for a in out:
        a.model = model
    r = client.chat.completions.create(model=chat_model, max_tokens=max_tokens, seed=7,
                                       temperature=0.7,
                                       messages=[{"role": "user", "content": CHAT_PROMPT}])
    out.append(Answer("chat (seed 7)", CHAT_PROMPT, r.choices[0].message.content or "",
                      dict((r.model_extra or {})["verification"]), model=chat_model))
    for a in out:  # what any client can check with eth-account alone
        a.signer = Account.recover_message(encode_typed_data(full_message=a.verification[
            "receipt"]), signature=a.verification["signature"])
    return out


def _answer_panel(i: int, a: Answer, operator: str) -> Panel:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    t.add_row("model", a.model)
    t.add_row("asked", a.prompt)
    t.add_row("answer", a.text.strip() or "[dim](empty)[/dim]")
    t.add_row("receipt id", a.verification["receipt_id"])
    ok = "[green]✓ the operator[/green]" if a.signer == operator else "[red]✗ not the operator"
    t.add_row("signer", f"{a.signer} {ok} (recovered with eth-account from the EIP-712 receipt)")
    t.add_row("DA pointer", a.verification["da_pointer"])
    return Panel(t, title=f"answer {i + 1}: {a.kind}", title_align="left")


def run_demo(directory: Path | None, model: str | None, *, keep: bool, max_tokens: int,
             console: Console, steps: Steps | None = None) -> DemoResult:
    """The demo; progress lines on ``steps`` (default: new ones on ``console``, after a
    title rule)."""

    res = DemoResult()
    d = (directory or Path(tempfile.mkdtemp(prefix="verinfer-devnet-"))).resolve() / "devnet"
    model_path: Path | str | None
    more: list[str] = []
    if model is None:  # both shipped models, served and judged under their names
        model_path, more = COMPLETION_MODEL, [CHAT_MODEL]
    elif model == "tiny":
        model_path = None  # `devnet up` writes the tiny test model
    else:
        model_path = Path(model)
    if steps is None:
        console.rule("[bold]verinfer devnet demo")
        steps = Steps(console)
    if (d / "devnet.json").exists():
        raise DevnetStateError(f"a devnet already runs in {d}", param="dir")
    t0 = time.monotonic()
    steps.say(f"bringing the devnet up in {d} (`--keep` leaves it running afterwards, "
              "the explorer with it)")
    try:
        start(d, model_path, more_models=more, steps=steps)
        dn = Devnet(d)
        with steps.step("waiting for the 4 verifiers to register on chain"):
            dn.wait_ready()
        res.seconds["devnet_up"] = time.monotonic() - t0
        console.print(f"devnet up in {res.seconds['devnet_up']:.0f} s: anvil {dn.rpc_url}, "
                      f"operator {dn.operator_url}, 5 KMS shards (t = 3), 4 verifiers; "
                      f"models {', '.join(Path(m).name for m in dn.state['models'])}")
        t1 = time.monotonic()
        with steps.step("asking the operator: 2 completions and 1 chat (openai SDK)"):
            res.answers = ask(dn, max_tokens)
        res.seconds["requests"] = time.monotonic() - t1
        operator = dn.state["accounts"]["operator"]
        for i, a in enumerate(res.answers):
            console.print(_answer_panel(i, a, operator))
        # the chat receipt: by default SmolLM2's, which the verifiers load on first use
        target = res.answers[-1].verification["receipt_id"]
        t2 = time.monotonic()
        with steps.step("waiting for the operator's batch to be committed on chain"):
            loc = dn.wait_located(target, timeout_s=120)
        assert loc.batch is not None and loc.proof is not None
        res.seconds["committed"] = time.monotonic() - t2
        console.print(f"batch 0x{loc.batch.batch_id.hex()[:16]}… committed at block "
                      f"{loc.batch.block_number}: root "
                      f"0x{loc.batch.root.hex()}, {loc.batch.leaf_count} receipts, manifest "
                      f"{loc.batch.manifest_pointer}")
        ch = dn.challenger()
        t3 = time.monotonic()
        _, cid = ch.open(loc)
        res.challenge_id = cid
        console.print(f"opened challenge {cid} on receipt {target} (bond "
                      f"{ch.c.config.params().challenge_bond / ETHER} ETH)")
        seen: list[str] = []

        def progress(s: dict[str, Any]) -> None:
            line = (f"challenge {cid}: {s['status']}, {s['commits']}/{s['members']} "
                    f"committed, {s['reveals']}/{s['members']} revealed")
            if not seen or seen[-1] != line:
                seen.append(line)
                steps.say(line)

        with steps.step("the committee re-executes the receipt in its enclaves"):
            final = ch.wait(cid, timeout_s=600, on_update=progress)
        res.seconds["challenge"] = time.monotonic() - t3
        res.status = final.name.lower()
        info = dn.read.challenges.challenge(cid)
        res.majority_matches_receipt = info.majority_out_hash == info.receipt_out_hash
        res.credited = dn.payout(cid).credited
        console.print(_summary(res, info))
    finally:
        if not (d / "devnet.json").exists():
            pass
        elif keep:
            console.print(f"kept running: `verinfer devnet status --dir {d}`, "
                          f"`verinfer devnet down --dir {d}`")
        else:
            with steps.step("bringing the devnet down, the explorer with it (`--keep` "
                            "leaves it running)"):
                stop(d)
    return res


def _summary(res: DemoResult, info: Any) -> Panel:
    t = Table(show_header=False, box=None)
    t.add_row("answers", f"{len(res.answers)}, each signed by the operator and published to DA")
    t.add_row("challenge", f"{res.challenge_id}: [bold]{res.status}[/bold] "
              f"({info.reveals}/{info.members} members revealed)")
    t.add_row("majority vote", "= the receipt's outHash" if res.majority_matches_receipt
              else "≠ the receipt's outHash")
    t.add_row("bond", ", ".join(f"{a[:10]}… +{w / ETHER:g} ETH"
                                for a, w in sorted(res.credited.items())) or "-")
    t.add_row("timings", ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds.items()))
    color = "green" if res.status == Status.DISMISSED.name.lower() else "red"
    return Panel(t, title=f"[{color}]verdict: {res.status}", border_style=color)
