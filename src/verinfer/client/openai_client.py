"""``VerifiedOpenAI`` / ``AsyncVerifiedOpenAI``: the official ``openai`` clients, with every
chat completion and text completion (streamed or not) checked before the app sees it.

The body bytes checked are the ones this client put on the wire: a request hook on the SDK's
own HTTP client records them (a context variable ties them to the call that sent them, so
threads and tasks sharing one client do not mix them up). Streams: with ``stream="verify_first"``
(the default) ``create`` reads the whole stream, checks it, and only then hands the chunks to
the app; with ``"incremental"`` chunks pass as they arrive and the check runs on the last one,
before the iteration ends (the app has seen unverified text by then).
"""

from __future__ import annotations

import asyncio
import contextvars
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import openai

from verinfer.chain.deploy import Deployment
from verinfer.client.chain_view import ChainView
from verinfer.client.errors import ClientConfigError, VerificationError, VerificationWarning
from verinfer.client.models import ClientModel, model_table
from verinfer.client.receipt_store import ReceiptStore
from verinfer.client.verify import Checked, Received, ReceivedCall, Verifier
from verinfer.protocol.request_rule import Endpoint
from verinfer.receipts.eip712 import MAX_ISSUED_AT_SKEW_S
from verinfer.receipts.signed import SignedReceipt


@dataclass(frozen=True)
class Policy:
    """What the client does when a check fails, and how strict it is.

    ``on_failure``: ``"raise"`` (VerificationError; the app never gets the answer), ``"warn"``
    (a VerificationWarning, the answer is returned) or ``"hook"`` (``hook(error)`` is called;
    the answer is returned unless the hook raises)."""

    on_failure: Literal["raise", "warn", "hook"] = "raise"
    hook: Callable[[VerificationError], None] | None = None
    stream: Literal["verify_first", "incremental"] = "verify_first"
    max_skew_s: int = MAX_ISSUED_AT_SKEW_S  # issuedAt at most this far ahead of the clock
    max_age_s: int = MAX_ISSUED_AT_SKEW_S  # ... and at most this far behind it
    cache_ttl_s: float = 30.0  # chain reads kept this long
    rpc_deadline_s: float = 5.0  # every chain call's whole-call deadline
    operators: Sequence[str] | None = None  # accept only these operators (None: any staked)
    fingerprints: Sequence[bytes] | None = None  # accept only these fingerprint hashes
    require_coverage: bool = True
    require_key_epoch: bool = True

    def __post_init__(self) -> None:
        if self.on_failure not in ("raise", "warn", "hook"):
            raise ClientConfigError(f"unknown on_failure {self.on_failure!r}", param="policy")
        if self.on_failure == "hook" and self.hook is None:
            raise ClientConfigError("on_failure='hook' needs a hook", param="policy")
        if self.stream not in ("verify_first", "incremental"):
            raise ClientConfigError(f"unknown stream mode {self.stream!r}", param="policy")


# ---- the bytes this client sent --------------------------------------------------------------
@dataclass
class _Capture:
    body: bytes | None = None


_SENT: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("verinfer_sent",
                                                                        default=None)


def _record(request: Any) -> None:
    cap = _SENT.get()
    if cap is not None and request.method == "POST":
        cap.body = bytes(request.content)


async def _arecord(request: Any) -> None:
    _record(request)


def _sent(cap: _Capture) -> bytes:
    if cap.body is None:
        raise VerificationError("request", "the request body this client sent was not seen")
    return cap.body


# ---- what was received -------------------------------------------------------------------------
def _extra(obj: Any) -> dict[str, Any]:
    return getattr(obj, "model_extra", None) or {}


def _evidence(choice: Any) -> dict[str, Any]:
    ev = _extra(choice).get("verinfer")
    return ev if isinstance(ev, dict) else {}


def _tokens(choice: Any) -> tuple[int, ...] | None:
    ids = _evidence(choice).get("output_token_ids")
    return tuple(ids) if isinstance(ids, list) else None


def _output_text(choice: Any) -> str | None:
    """``choices[i].verinfer.output_text``: the text the receipt's text hash covers, given
    when the message is not the whole output (a tool-call answer)."""
    text = _evidence(choice).get("output_text")
    return text if isinstance(text, str) else None


def _call(tc: Any) -> ReceivedCall:
    fn = getattr(tc, "function", None)
    return ReceivedCall(getattr(tc, "id", None), getattr(tc, "type", None),
                        getattr(fn, "name", None), getattr(fn, "arguments", None))


def _received(endpoint: Endpoint, response: Any) -> tuple[Any, list[Received]]:
    out = []
    for c in sorted(response.choices, key=lambda c: c.index):
        if endpoint != "chat":
            out.append(Received(c.text or "", c.finish_reason, _tokens(c)))
            continue
        m = c.message
        out.append(Received(m.content, c.finish_reason, _tokens(c), _output_text(c),
                            tuple(_call(tc) for tc in m.tool_calls or ()),
                            getattr(m, "function_call", None), getattr(m, "refusal", None)))
    return _extra(response).get("verification"), out


def _join(a: Any, b: Any) -> Any:
    """A streamed field's fragments as the SDK's stream helper accumulates them: strings
    concatenated, the first value kept otherwise."""
    if a is None:
        return b
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    return a


class _Assembler:
    """A stream's message per choice (content deltas concatenated, tool-call deltas joined per
    index as the SDK accumulates them), finish reasons, the output text of each choice's last
    chunk, and the verification object (the last chunk carries it)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.parts: dict[int, list[str]] = {}
        self.finish: dict[int, str | None] = {}
        self.output_text: dict[int, str] = {}
        self.calls: dict[int, dict[int, list[Any]]] = {}  # choice -> call index -> fields
        self.legacy: dict[int, tuple[Any, Any]] = {}  # choice -> (function_call, refusal)
        self.verification: Any = None

    def add(self, chunk: Any) -> None:
        for c in chunk.choices or ():
            piece = (c.delta.content if self.endpoint == "chat" else c.text) or ""
            self.parts.setdefault(c.index, []).append(piece)
            if c.finish_reason is not None:
                self.finish[c.index] = c.finish_reason
            text = _output_text(c)
            if text is not None:
                self.output_text[c.index] = text
            if self.endpoint == "chat":
                self._delta(c.index, c.delta)
        v = _extra(chunk).get("verification")
        if v is not None:
            self.verification = v

    def _delta(self, index: int, delta: Any) -> None:
        fc, refusal = getattr(delta, "function_call", None), getattr(delta, "refusal", None)
        if fc is not None or refusal is not None:
            old = self.legacy.get(index, (None, None))
            self.legacy[index] = (old[0] or fc, _join(old[1], refusal))
        calls = self.calls.setdefault(index, {})
        for tc in getattr(delta, "tool_calls", None) or ():
            fn = getattr(tc, "function", None)
            new = [getattr(tc, "id", None), getattr(tc, "type", None),
                   getattr(fn, "name", None), getattr(fn, "arguments", None)]
            old = calls.get(tc.index)
            if old is None:
                calls[tc.index] = new
            else:  # the SDK replaces ``type`` (a discriminator) and concatenates the strings
                joined = [_join(a, b) for a, b in zip(old, new, strict=True)]
                joined[1] = new[1] if new[1] is not None else old[1]
                calls[tc.index] = joined

    def received(self) -> list[Received]:
        out = []
        for i in sorted(self.parts):
            calls = self.calls.get(i, {})
            listed = tuple(ReceivedCall(*calls[k]) for k in sorted(calls))
            if sorted(calls) != list(range(len(calls))):  # indexes other than 0..n-1: a call
                listed += (ReceivedCall(None, None, None, None),)  # no honest answer has
            fc, refusal = self.legacy.get(i, (None, None))
            out.append(Received("".join(self.parts[i]), self.finish.get(i), None,
                                self.output_text.get(i), listed, fc, refusal))
        return out


# ---- the checks and the policy -----------------------------------------------------------------
@dataclass
class _Core:
    verifier: Verifier
    policy: Policy
    store: ReceiptStore | None = None  # accepted receipts are kept here (the keeper follows)

    def check(self, endpoint: Endpoint, body: bytes, verification: Any,
              received: list[Received]) -> list[Checked] | None:
        try:
            out = self.verifier.verify(endpoint, body, verification, received)
        except VerificationError as e:
            self.fail(e)
            return None
        if self.store is not None:
            for c in out:
                self.store.add(SignedReceipt(c.receipt, c.domain, c.signature))
        return out

    def fail(self, e: VerificationError) -> None:
        if self.policy.on_failure == "raise":
            raise e
        if self.policy.on_failure == "warn":
            warnings.warn(VerificationWarning(e), stacklevel=4)
            return
        assert self.policy.hook is not None
        self.policy.hook(e)


class VerifiedStream:
    """A checked ``openai.Stream``: iterate it as the SDK's own."""

    def __init__(self, stream: Any, core: _Core, endpoint: Endpoint, body: bytes) -> None:
        self._stream, self.response = stream, getattr(stream, "response", None)
        self._core, self._endpoint, self._body = core, endpoint, body
        if core.policy.stream == "verify_first":
            asm = _Assembler(endpoint)
            with stream:
                chunks = list(stream)
            for c in chunks:
                asm.add(c)
            self.receipts = core.check(endpoint, body, asm.verification, asm.received())
            self._it: Iterator[Any] = iter(chunks)
        else:
            self.receipts = None
            self._it = self._incremental()

    def _incremental(self) -> Iterator[Any]:
        asm = _Assembler(self._endpoint)
        for c in self._stream:
            asm.add(c)
            yield c
        self.receipts = self._core.check(self._endpoint, self._body, asm.verification,
                                         asm.received())

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> VerifiedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncVerifiedStream:
    """A checked ``openai.AsyncStream``."""

    def __init__(self, stream: Any, core: _Core, endpoint: Endpoint, body: bytes,
                 chunks: list[Any] | None = None, receipts: list[Checked] | None = None
                 ) -> None:
        self._stream, self.response = stream, getattr(stream, "response", None)
        self._core, self._endpoint, self._body = core, endpoint, body
        self.receipts = receipts
        self._it: AsyncIterator[Any] = (self._listed(chunks) if chunks is not None
                                        else self._incremental())

    @classmethod
    async def verify_first(cls, stream: Any, core: _Core, endpoint: Endpoint,
                           body: bytes) -> AsyncVerifiedStream:
        asm = _Assembler(endpoint)
        async with stream:
            chunks = [c async for c in stream]
        for c in chunks:
            asm.add(c)
        receipts = await asyncio.to_thread(core.check, endpoint, body, asm.verification,
                                           asm.received())
        return cls(stream, core, endpoint, body, chunks, receipts)

    @staticmethod
    async def _listed(chunks: list[Any]) -> AsyncIterator[Any]:
        for c in chunks:
            yield c

    async def _incremental(self) -> AsyncIterator[Any]:
        asm = _Assembler(self._endpoint)
        async for c in self._stream:
            asm.add(c)
            yield c
        self.receipts = await asyncio.to_thread(self._core.check, self._endpoint, self._body,
                                                asm.verification, asm.received())

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        return await self._it.__anext__()

    async def close(self) -> None:
        await self._stream.close()

    async def __aenter__(self) -> AsyncVerifiedStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ---- the resources -----------------------------------------------------------------------------
class _Resource:
    """``chat.completions`` or ``completions``: ``create`` checked, everything else passed
    through (note: ``with_raw_response`` / ``with_streaming_response`` are the SDK's own and
    NOT checked)."""

    def __init__(self, inner: Any, core: _Core, endpoint: Endpoint) -> None:
        self._inner, self._core, self._endpoint = inner, core, endpoint

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _SyncResource(_Resource):
    def create(self, **kwargs: Any) -> Any:
        cap = _Capture()
        token = _SENT.set(cap)
        try:
            out = self._inner.create(**kwargs)
        finally:
            _SENT.reset(token)
        body = _sent(cap)
        if isinstance(out, openai.Stream):
            return VerifiedStream(out, self._core, self._endpoint, body)
        verification, received = _received(self._endpoint, out)
        self._core.check(self._endpoint, body, verification, received)
        return out


class _AsyncResource(_Resource):
    async def create(self, **kwargs: Any) -> Any:
        cap = _Capture()
        token = _SENT.set(cap)
        try:
            out = await self._inner.create(**kwargs)
        finally:
            _SENT.reset(token)
        body = _sent(cap)
        if isinstance(out, openai.AsyncStream):
            if self._core.policy.stream == "verify_first":
                return await AsyncVerifiedStream.verify_first(out, self._core, self._endpoint,
                                                              body)
            return AsyncVerifiedStream(out, self._core, self._endpoint, body)
        verification, received = _received(self._endpoint, out)
        await asyncio.to_thread(self._core.check, self._endpoint, body, verification,
                                received)
        return out


class _Chat:
    def __init__(self, inner: Any, completions: _Resource) -> None:
        self._inner, self.completions = inner, completions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


# ---- the clients -------------------------------------------------------------------------------
def _install(http_client: Any, hook: Callable[[Any], Any]) -> None:
    """Adds the body recorder to the SDK's HTTP client (once: a copy may share the client)."""
    hooks = http_client.event_hooks
    if hook not in hooks.get("request", []):
        http_client.event_hooks = {**hooks, "request": [*hooks.get("request", []), hook]}


def _core(models: Sequence[ClientModel | str | Path], rpc_url: str | None,
          deployment: Deployment | str | Path | None, chain_id: int | None,
          policy: Policy, receipts: ReceiptStore | str | Path | None = None) -> _Core:
    if deployment is None:
        raise ClientConfigError("a verified client needs the deployment (deployment.json or "
                                "a Deployment: contract addresses and chain id)",
                                param="deployment")
    dep = deployment if isinstance(deployment, Deployment) else Deployment.load(Path(deployment))
    if chain_id is not None and chain_id != dep.chain_id:
        raise ClientConfigError(f"chain_id {chain_id} but the deployment is on chain "
                                f"{dep.chain_id}", param="chain_id")
    view = ChainView(rpc_url, dep, ttl_s=policy.cache_ttl_s, deadline_s=policy.rpc_deadline_s)
    verifier = Verifier(view, model_table(models), max_skew_s=policy.max_skew_s,
                        max_age_s=policy.max_age_s, operators=policy.operators,
                        fingerprints=policy.fingerprints,
                        require_coverage=policy.require_coverage,
                        require_key_epoch=policy.require_key_epoch)
    store = (receipts if isinstance(receipts, ReceiptStore) or receipts is None
             else ReceiptStore(receipts))
    if store is not None:
        store.bind_deployment(dep.chain_id, dep.challenge_manager)
    return _Core(verifier, policy, store)


class VerifiedOpenAI(openai.OpenAI):
    """``openai.OpenAI`` (same keyword arguments) whose ``chat.completions.create`` and
    ``completions.create`` return only answers that passed every check (docs/client.md).

    ``models``: the models the app accepts (GGUF paths or :class:`ClientModel`); ``rpc_url``,
    ``deployment`` (deployment.json or a Deployment) and optionally ``chain_id`` (checked
    against the deployment and the RPC) name the chain; ``policy`` what a failure does;
    ``receipts`` (a :class:`~verinfer.client.receipt_store.ReceiptStore` or its file) keeps
    every accepted receipt for the keeper (:mod:`verinfer.client.keeper`)."""

    def __init__(self, *, models: Sequence[ClientModel | str | Path] = (),
                 rpc_url: str | None = None, deployment: Deployment | str | Path | None = None,
                 chain_id: int | None = None, policy: Policy | None = None,
                 receipts: ReceiptStore | str | Path | None = None,
                 _verification: _Core | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.verification = (_verification if _verification is not None else
                              _core(models, rpc_url, deployment, chain_id, policy or Policy(),
                                    receipts))
        _install(self._client, _record)

    def copy(self, **kwargs: Any) -> Any:
        """The SDK's ``copy`` / ``with_options``: the copy checks with the same settings (and
        shares the chain cache)."""
        extra = {**kwargs.pop("_extra_kwargs", {}), "_verification": self.verification}
        return super().copy(_extra_kwargs=extra, **kwargs)

    with_options = copy

    @cached_property
    def chat(self) -> Any:
        inner = super().chat
        return _Chat(inner, _SyncResource(inner.completions, self.verification, "chat"))

    @cached_property
    def completions(self) -> Any:
        return _SyncResource(super().completions, self.verification, "completions")


class AsyncVerifiedOpenAI(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` with the same checks as :class:`VerifiedOpenAI` (chain reads
    run in a worker thread)."""

    def __init__(self, *, models: Sequence[ClientModel | str | Path] = (),
                 rpc_url: str | None = None, deployment: Deployment | str | Path | None = None,
                 chain_id: int | None = None, policy: Policy | None = None,
                 receipts: ReceiptStore | str | Path | None = None,
                 _verification: _Core | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.verification = (_verification if _verification is not None else
                              _core(models, rpc_url, deployment, chain_id, policy or Policy(),
                                    receipts))
        _install(self._client, _arecord)

    def copy(self, **kwargs: Any) -> Any:
        """The SDK's ``copy`` / ``with_options``: the copy checks with the same settings (and
        shares the chain cache)."""
        extra = {**kwargs.pop("_extra_kwargs", {}), "_verification": self.verification}
        return super().copy(_extra_kwargs=extra, **kwargs)

    with_options = copy

    @cached_property
    def chat(self) -> Any:
        inner = super().chat
        return _Chat(inner, _AsyncResource(inner.completions, self.verification, "chat"))

    @cached_property
    def completions(self) -> Any:
        return _AsyncResource(super().completions, self.verification, "completions")
