"""A user gets an honest operator slashed with a temperature of 1e-310.

The attack: the body asks for ``"temperature": 1e-310`` (a subnormal double, which the rule
accepted as "in [0, 2]"). The sampler computes ``z = logit / temperature``: +inf/-inf for every
ordinary logit, then ``z - max z`` = inf - inf = NaN. The sampling kernel does not refuse that
(it checked only the logits; it now checks z too), and its two paths part ways on a NaN: the
AVX2 exp clamps with ``max_pd(x, floor)``, which turns a NaN into the floor's value, while the
portable exp (the kernel's own loop tail on AVX2 machines too, and every machine without AVX2)
keeps the NaN. So the drawn token depends on the verifier's CPU and on the vocabulary size
modulo 16: an honest operator's receipt can be voted a mismatch. The rule's executable
definition (``engine.sampling.sample_reference``) refuses such logits outright, so the kernel
departs from its own specification there. Who gains: a griefing user or a watcher paid for
challenges.

Fix (one home, ``verinfer.protocol.limits.MIN_POSITIVE_TEMPERATURE``): a temperature is 0 or at
least 1e-6, in the request rule (an honest server answers 400; a receipt for such a body is
nonconformant) and in ``SamplingParams.validate`` (the engine refuses to run one).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest

from verinfer.chain.structs import INVALID_EVIDENCE
from verinfer.engine.engine import Engine
from verinfer.engine.sampling import sample, sample_reference
from verinfer.engine.served import prompt_tokenizer, served_model
from verinfer.errors import InvalidRequestError, KernelError
from verinfer.protocol import limits as L
from verinfer.protocol.request_rule import exec_requests
from verinfer.protocol.sampling_params import SamplingParams
from verinfer.receipts.canonical import ExecResult
from verinfer.receipts.eip712 import Domain, ReceiptSigner
from verinfer.receipts.epoch_keys import EnvelopeSuite, derive_epoch_keypair
from verinfer.testing.evidence import EvidenceFactory
from verinfer.verifier.reexec import judge

SIGNER = ReceiptSigner(hashlib.sha256(b"tiny temperature").digest())
DOMAIN = Domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
SK, PK = derive_epoch_keypair(hashlib.sha256(b"tiny temperature epoch").digest(),
                              EnvelopeSuite.X25519)
SUBNORMAL = 1e-310


def _body(temperature: str) -> bytes:
    return (b'{"model":"tiny","messages":[{"role":"user","content":"cold"}],"max_tokens":4,'
            b'"seed":7,"temperature":' + temperature.encode() + b"}")


def _logits(seed: int, vocab: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 8.0, vocab).astype(np.float32)
    x[rng.integers(vocab)] = np.float32(3.0e38)  # the extremes a float32 logit can take
    x[rng.integers(vocab)] = np.float32(-3.0e38)
    return x


@pytest.mark.filterwarnings("ignore:overflow encountered in divide")
def test_below_the_bound_kernel_and_definition_both_refuse() -> None:
    """Below the rule's bound (never reached through the rule): the kernel used to draw an
    ISA-dependent token where the definition refuses; it now refuses a non-finite
    logit / temperature as the definition does (csrc/verinfer_sampling.cpp scale_row)."""
    logits = _logits(0)
    params = SamplingParams(max_tokens=1, temperature=SUBNORMAL, seed=7)
    with pytest.raises(ValueError, match="NaN or an infinity"):
        sample_reference(logits, params, 3)
    with pytest.raises(KernelError, match="NaN or an infinity"):
        sample(logits, params, 3)


@pytest.mark.parametrize("temperature", [1e-6, 1e-3, 0.7, 2.0])
def test_at_and_above_the_bound_kernel_and_definition_agree(temperature: float) -> None:
    assert L.MIN_POSITIVE_TEMPERATURE == 1e-6  # the first case is the bound
    for seed in range(4):
        logits = _logits(seed)
        params = SamplingParams(max_tokens=1, temperature=temperature, seed=seed)
        for pos in range(8):
            assert sample(logits, params, pos) == sample_reference(logits, params, pos)


@pytest.mark.parametrize("spelling", ["1e-310", "5e-324", "4.9e-324", "1e-7", "9.99e-7"])
def test_the_rule_refuses_a_positive_temperature_below_the_bound(
        tiny_engine: Engine, spelling: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        exec_requests(_body(spelling), served_model(tiny_engine), prompt_tokenizer(tiny_engine))
    assert e.value.param == "temperature"
    with pytest.raises(InvalidRequestError):
        SamplingParams(temperature=float(spelling)).validate()


@pytest.mark.parametrize("spelling", ["0", "-0.0", "1e-6", "0.000001", "2"])
def test_the_rule_keeps_zero_and_the_bound(tiny_engine: Engine, spelling: str) -> None:
    req = exec_requests(_body(spelling), served_model(tiny_engine),
                        prompt_tokenizer(tiny_engine))[0]
    assert req.temperature == float(spelling) + 0.0


def test_a_receipt_for_a_subnormal_temperature_is_voted_against(tiny_engine: Engine) -> None:
    """An operator that serves such a body anyway signs a receipt the committee refuses (the
    honest server answers 400 instead); before the fix the job voted ``match`` on this
    machine, and on a machine with another exp path it would have voted a mismatch."""
    body = _body("1e-310")
    rule = exec_requests(_body("0.5"), served_model(tiny_engine), prompt_tokenizer(tiny_engine))
    request = replace(rule[0], temperature=json.loads(b"1e-310"))  # the rule's request before
    prompt = list(request.prompt_token_ids)
    try:  # what this machine's kernel draws for it (what an honest server used to sign)
        gen = tiny_engine.generate(prompt, request.sampling_params())
    except InvalidRequestError:  # the engine refuses it now: any claimed answer will do
        gen = tiny_engine.generate(prompt, rule[0].sampling_params())
    factory = EvidenceFactory(tiny_engine, SIGNER, DOMAIN, key_epoch=4, epoch_public_key=PK,
                              now=lambda: 1_800_000_000)
    ev = factory._finish(body, request, ExecResult.from_generation(gen), gen.text)
    v = judge(tiny_engine, ev.signed.receipt, ev.blob, SK)
    assert (v.vote, v.reason) == (INVALID_EVIDENCE, "request_nonconformant")
