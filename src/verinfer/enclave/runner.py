"""The in-enclave runner: obtain the epoch key from t-of-n KMS shards, run a job with it, wipe.

1. fresh ephemeral X25519 key pair (the shares travel encrypted to it);
2. a nonce from every shard, concurrently (shards that are down, or answer anything but a
   small well-formed JSON nonce, are skipped — answers are read up to a size bound and parsed
   with ``loads_untrusted``: a shard is one of n, never trusted to keep the runner alive);
3. one quote whose report_data binds (epoch, purpose, challenge id, requester, ephemeral
   public key, all nonces) and the requester's signature over it;
4. releases from t shards at a time, concurrently, asking further shards for each refusal,
   failure or corrupt share, until t shares pass the Feldman check — a share that fails is
   reported by shard index before any reconstruction. Every shard sees the whole body (the
   quote binds all nonces); a shard that forwards it to the others cannot block the release,
   because shards spend a nonce only on an authorized request and answer the identical
   request again with the identical release (kms/nonces.py);
5. Lagrange interpolation of s, derivation of the HPKE private key (checked against the
   registered epoch public key), the job, then wiping of every buffer we own (zeroize.py).

That is the legacy path (X25519 and ML-KEM hybrid epochs, whose keys cannot be used without
rebuilding them). Threshold P-256 epochs never rebuild anything: :meth:`EnclaveRunner.
open_receipt` asks for one envelope at a time (``POST /v1/decrypt``, the request binding the
receipt and its ciphertext), checks each shard's D_i = s_i·E against its DLEQ proof and the
Feldman commitments — a shard whose proof fails is named in ``corrupt_shards`` and the next one
is asked —, combines t of them in the exponent and opens that envelope only (kms/tdh.py).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import httpx
from Crypto.PublicKey import ECC
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from eth_account.signers.local import LocalAccount

from verinfer.attestation.quotes import Attester
from verinfer.enclave.errors import EnclaveError, JobError, KeyReleaseError
from verinfer.enclave.zeroize import wipe, wipe_all
from verinfer.errors import VerinferError
from verinfer.kms import tdh
from verinfer.kms.app_keys import app_keypair
from verinfer.kms.directory import ShardInfo
from verinfer.kms.epochs import EpochRecord, EpochRegistry
from verinfer.kms.errors import ShareVerificationError
from verinfer.kms.identity import recover_eip191_signer, sign_eip191
from verinfer.kms.protocol import (
    TRANSPORT_SUITE,
    AuditAssignment,
    DecryptTarget,
    Release,
    ReleaseRequest,
    admission_headers,
    dleq_context,
    partial_info,
    release_digest,
    report_data,
    requester_digest,
    share_info,
)
from verinfer.kms.shamir import Q, Share, public_key_of, reconstruct, verify_share
from verinfer.protocol.hexutil import parse_hex
from verinfer.protocol.jsonsafe import UntrustedJsonError, loads_untrusted
from verinfer.receipts.eip712 import Receipt
from verinfer.receipts.envelope import EnvelopeContents, open_envelope_with, split_envelope
from verinfer.receipts.epoch_keys import EnvelopeSuite, EpochPrivateKey
from verinfer.receipts.errors import EnvelopeDecryptionError, ReusedEncapsulationError

T = TypeVar("T")
A = TypeVar("A")  # a shard's opened answer (a partial decryption, a share buffer)

#: Largest shard answer read: a release is ~600 bytes, a refusal or nonce less.
MAX_ANSWER_BYTES = 64 * 1024
#: Deepest nesting of any shard answer ({"error": {...}}).
MAX_ANSWER_DEPTH = 4


class ShardAnswerError(Exception):
    """A shard's answer is too big, too slow or not acceptable JSON (a refusal reason)."""


class RequesterSigner(Protocol):
    """The verifier account asking for the key (signs the request's report_data digest)."""

    @property
    def address(self) -> str: ...

    def sign(self, digest: bytes) -> bytes: ...


class AccountSigner:
    def __init__(self, account: LocalAccount) -> None:
        self._account = account

    @property
    def address(self) -> str:
        return str(self._account.address).lower()

    def sign(self, digest: bytes) -> bytes:
        return sign_eip191(self._account, digest)


@dataclass
class EpochKey:
    """The reconstructed key in enclave memory. ``close()`` wipes what we own."""

    epoch: int
    private_key: EpochPrivateKey | None
    shards_used: list[int]
    corrupt_shards: list[int]
    refusals: dict[int, str]
    _buffers: list[bytearray] = field(default_factory=list, repr=False)

    def close(self) -> None:
        wipe_all(self._buffers)
        self._buffers.clear()
        self.private_key = None

    def __enter__(self) -> EpochKey:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ReceiptOpening:
    """One envelope opened through per-receipt threshold decryption."""

    contents: EnvelopeContents
    shards_used: list[int]
    corrupt_shards: list[int]
    refusals: dict[int, str]
    ms: float  # request start -> plaintext


@dataclass(frozen=True)
class JobOutcome(Generic[T]):
    result: T
    shards_used: list[int]
    corrupt_shards: list[int]
    refusals: dict[int, str]
    key_ms: float  # runner start -> key in memory


class EnclaveRunner:
    def __init__(self, *, attester: Attester, shards: Sequence[ShardInfo],
                 epochs: EpochRegistry, signer: RequesterSigner, timeout_s: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if len({s.index for s in shards}) != len(shards):
            raise EnclaveError(f"duplicate shard indices in {[s.index for s in shards]}")
        self.attester = attester
        self.shards = {s.index: s for s in shards}
        self.epochs = epochs
        self.signer = signer
        self.timeout_s = timeout_s
        self._transport = transport
        self._clock = clock
        # per-epoch shard verification keys V_i (2 point multiplications each at t = 3)
        self._vkeys: dict[tuple[int, tuple[str, ...]], dict[int, ECC.EccPoint]] = {}

    # ---- public API ----------------------------------------------------------------------
    def obtain_key(self, *, epoch: int, purpose: str, challenge_id: str) -> EpochKey:
        return asyncio.run(self.obtain_key_async(epoch=epoch, purpose=purpose,
                                                 challenge_id=challenge_id))

    def run(self, job: Callable[[EpochPrivateKey], T], *, epoch: int, purpose: str,
            challenge_id: str) -> JobOutcome[T]:
        t0 = self._clock()
        with self.obtain_key(epoch=epoch, purpose=purpose, challenge_id=challenge_id) as key:
            key_ms = (self._clock() - t0) * 1000
            assert key.private_key is not None
            try:
                result = job(key.private_key)
            except VerinferError:
                raise
            except Exception as e:
                raise JobError(f"job failed: {type(e).__name__}: {e}") from e
            return JobOutcome(result, list(key.shards_used), list(key.corrupt_shards),
                              dict(key.refusals), key_ms)

    async def obtain_key_async(self, *, epoch: int, purpose: str,
                               challenge_id: str) -> EpochKey:
        record = self.epochs.get(epoch)
        if EnvelopeSuite.parse(record.suite).threshold_decapsulable:
            raise EnclaveError(f"epoch {epoch} ({record.suite}) is never rebuilt: open its "
                               "envelopes one by one with open_receipt")
        ephemeral = X25519PrivateKey.generate()
        refusals: dict[int, str] = {}
        async with httpx.AsyncClient(timeout=self.timeout_s, transport=self._transport) as http:
            req, rd = await self._attested_request(http, record, ephemeral, refusals,
                                                   purpose=purpose, challenge_id=challenge_id)
            shares, buffers, corrupt = await self._collect_shares(
                http, req, rd, record, ephemeral, refusals)
        del ephemeral
        return self._rebuild(record, shares, buffers, corrupt, refusals)

    def open_receipt(self, *, receipt: Receipt, ciphertext: bytes,
                     purpose: str, challenge_id: str,
                     assignment: AuditAssignment | None = None) -> ReceiptOpening:
        """Open the envelope of ``receipt`` by per-receipt threshold decryption (threshold
        epochs only). Raises KeyReleaseError (fewer than t valid partials, naming refusals and
        corrupt shards), EnvelopeDecryptionError / EnvelopeContentError like open_envelope —
        including a bad encapsulated key or proof (checked here first) and t or more shards
        refusing ``encapsulation_reused`` (ReusedEncapsulationError: the sealer reused e)."""
        return asyncio.run(self.open_receipt_async(
            receipt=receipt, ciphertext=ciphertext, purpose=purpose,
            challenge_id=challenge_id, assignment=assignment))

    async def open_receipt_async(self, *, receipt: Receipt, ciphertext: bytes,
                                 purpose: str, challenge_id: str,
                                 assignment: AuditAssignment | None = None
                                 ) -> ReceiptOpening:
        t0 = self._clock()
        record = self.epochs.get(receipt.key_epoch)
        suite = EnvelopeSuite.parse(record.suite)
        if not suite.threshold_decapsulable:
            raise EnclaveError(f"epoch {record.epoch} ({record.suite}) has no per-receipt "
                               "decryption; use obtain_key")
        # header, epoch, ciphertextHash and E checked before anything is sent: an envelope
        # that cannot be opened is the operator's fault (a vote), not a KMS outage (a retry)
        _, enc, _ = split_envelope(ciphertext, receipt, suite)
        try:
            tdh.point(enc, "encapsulated key")
        except tdh.PointError:
            raise EnvelopeDecryptionError() from None
        target = DecryptTarget(receipt, ciphertext)
        ephemeral = X25519PrivateKey.generate()
        refusals: dict[int, str] = {}
        async with httpx.AsyncClient(timeout=self.timeout_s, transport=self._transport) as http:
            req, rd = await self._attested_request(
                http, record, ephemeral, refusals, purpose=purpose, challenge_id=challenge_id,
                target=target, assignment=assignment)
            try:
                partials, corrupt = await self._collect_partials(http, req, rd, record, enc,
                                                                 ephemeral, refusals)
            except KeyReleaseError:
                reused = sorted(i for i, why in refusals.items()
                                if why == "encapsulation_reused")
                if len(reused) >= record.threshold:
                    # t refusals include an honest shard's: the sealer's fault, not an outage
                    raise ReusedEncapsulationError(
                        f"shards {reused} already decrypted another envelope with this "
                        "envelope's encapsulated key: its sealer reused its ephemeral key"
                    ) from None
                raise
        del ephemeral
        dh = tdh.combine(partials, record.threshold)
        pk_r = record.public_key_bytes
        contents = open_envelope_with(
            ciphertext, receipt, suite,
            lambda e, info, ct: tdh.open_single_shot(dh, e, pk_r, info, ct))
        return ReceiptOpening(contents, sorted(partials), corrupt, refusals,
                              (self._clock() - t0) * 1000)

    async def _attested_request(
            self, http: httpx.AsyncClient, record: EpochRecord, ephemeral: X25519PrivateKey,
            refusals: dict[int, str], *, purpose: str, challenge_id: str,
            target: DecryptTarget | None = None, assignment: AuditAssignment | None = None,
    ) -> tuple[ReleaseRequest, bytes]:
        """(request, report_data) for a release or a per-receipt decryption: fresh nonces
        from at least t shards, report_data binding them to the enclave key, the requester,
        the purpose and the target, the requester's signature and a quote over it."""
        nonces = await self._collect_nonces(http, refusals)
        if len(nonces) < record.threshold:
            raise KeyReleaseError(
                f"epoch {record.epoch}: only {len(nonces)} of {len(self.shards)} shards "
                f"issued a nonce, need {record.threshold} ({_describe(refusals)})",
                refusals=refusals, corrupt_shards=[])
        enclave_pub = ephemeral.public_key().public_bytes_raw()
        rd = report_data(epoch=record.epoch, purpose=purpose, challenge_id=challenge_id,
                         requester=self.signer.address, enclave_public_key=enclave_pub,
                         nonces=nonces, target=target)
        req = ReleaseRequest(epoch=record.epoch, purpose=purpose, challenge_id=challenge_id,
                             requester=self.signer.address,
                             requester_signature=self.signer.sign(requester_digest(rd)),
                             enclave_public_key=enclave_pub, nonces=nonces,
                             quote=self.attester.quote(rd), target=target,
                             assignment=assignment)
        return req, rd

    def _verification_keys(self, record: EpochRecord) -> dict[int, ECC.EccPoint]:
        key = (record.epoch, record.commitments)
        cached = self._vkeys.get(key)
        if cached is None:
            cpts = tdh.parse_commitments(record.commitment_bytes, record.threshold)
            cached = {i: tdh.verification_key(cpts, i) for i in range(1, record.shares + 1)}
            self._vkeys[key] = cached
        return cached

    async def _collect_partials(
            self, http: httpx.AsyncClient, req: ReleaseRequest, rd: bytes, record: EpochRecord,
            enc: bytes, ephemeral: X25519PrivateKey, refusals: dict[int, str],
    ) -> tuple[dict[int, ECC.EccPoint], list[int]]:
        body = req.to_json()
        headers = admission_headers(req)  # a shard reads a large body only after checking them
        vkeys = self._verification_keys(record)
        partials: dict[int, ECC.EccPoint] = {}
        corrupt: list[int] = []

        def accept(idx: int, raw: bytes) -> bool:
            try:
                partials[idx] = tdh.verify_partial(raw, index=idx, enc=enc,
                                                   verification=vkeys[idx],
                                                   context=dleq_context(rd, idx))
            except ShareVerificationError as e:
                corrupt.append(idx)
                refusals[idx] = f"share_verification_failed: {e.message}"
                return False
            return True

        await _ask_until(
            sorted(i for i in req.nonces if i in vkeys), record.threshold,
            lambda idx: self._ask_shard(
                http, idx, "/v1/decrypt", body, "partial decryption", refusals,
                lambda d, shard: self._open_partial(d, shard, req.epoch, rd, ephemeral),
                headers=headers),
            accept)
        if len(partials) < record.threshold:
            raise KeyReleaseError(
                f"epoch {req.epoch}: {len(partials)} valid partial decryptions, need "
                f"{record.threshold} (corrupt: {sorted(corrupt)}; {_describe(refusals)})",
                refusals=refusals, corrupt_shards=sorted(corrupt))
        return partials, sorted(corrupt)

    def _open_partial(self, d: Any, shard: ShardInfo, epoch: int, rd: bytes,
                      ephemeral: X25519PrivateKey) -> bytes:
        rel = Release.from_json(d)
        if rel.epoch != epoch or rel.shard_index != shard.index or rel.report_data != rd:
            raise ValueError(f"answer from shard {shard.index} answers another request")
        signer = recover_eip191_signer(release_digest(rel.unsigned_json()), rel.signature)
        if signer != shard.address or rel.shard_address != shard.address:
            raise ValueError(f"answer signed by {signer}, shard {shard.index} is {shard.address}")
        return TRANSPORT_SUITE.decrypt(rel.encrypted_share, ephemeral,
                                       info=partial_info(epoch, shard.index, rd))

    # ---- steps ---------------------------------------------------------------------------
    async def _collect_nonces(self, http: httpx.AsyncClient,
                              refusals: dict[int, str]) -> dict[int, bytes]:
        async def one(s: ShardInfo) -> tuple[int, bytes | None]:
            try:
                status, data = await self._post(http, f"{s.url}/v1/nonce", None)
            except httpx.HTTPError as e:
                refusals[s.index] = f"unreachable: {type(e).__name__}: {e}"
                return s.index, None
            except ShardAnswerError as e:
                refusals[s.index] = f"bad_answer: {e}"
                return s.index, None
            if status != 200:
                refusals[s.index] = _reason(status, data)
                return s.index, None
            try:
                d = _parse(data, f"shard {s.index} nonce answer")
                # the shard app writes "0x" + 32 bytes; HexFormatError is a ValueError below
                nonce = parse_hex(d["nonce"], 32, "nonce")
            except UntrustedJsonError as e:
                refusals[s.index] = f"bad_answer: {e.code}: {e.message}"
                return s.index, None
            except (ValueError, KeyError, TypeError) as e:
                refusals[s.index] = f"bad_answer: {type(e).__name__}: {e}"
                return s.index, None
            return s.index, nonce

        got = await asyncio.gather(*(one(s) for s in self.shards.values()))
        return {i: n for i, n in got if n is not None}

    async def _collect_shares(
            self, http: httpx.AsyncClient, req: ReleaseRequest, rd: bytes, record: EpochRecord,
            ephemeral: X25519PrivateKey, refusals: dict[int, str],
    ) -> tuple[list[Share], list[bytearray], list[int]]:
        body = req.to_json()
        commitments = record.commitment_bytes
        candidates = sorted(req.nonces)
        shares: list[Share] = []
        buffers: list[bytearray] = []
        corrupt: list[int] = []

        def accept(idx: int, buf: bytearray) -> bool:
            share = Share(idx, int.from_bytes(buf, "big") % Q)
            try:
                verify_share(share, commitments)
            except ShareVerificationError as e:
                corrupt.append(idx)
                refusals[idx] = f"share_verification_failed: {e.message}"
                wipe(buf)
                return False
            buffers.append(buf)
            shares.append(share)
            return True

        await _ask_until(
            candidates, record.threshold,
            lambda idx: self._ask_shard(
                http, idx, "/v1/release", body, "release", refusals,
                lambda d, shard: self._open_release(d, shard, req.epoch, rd, ephemeral)),
            accept)
        if len(shares) < record.threshold:
            wipe_all(buffers)
            raise KeyReleaseError(
                f"epoch {req.epoch}: {len(shares)} valid shares, need {record.threshold} "
                f"(corrupt: {sorted(corrupt)}; {_describe(refusals)})",
                refusals=refusals, corrupt_shards=sorted(corrupt))
        return shares, buffers, sorted(corrupt)

    async def _ask_shard(self, http: httpx.AsyncClient, idx: int, path: str, body: Any,
                         what: str, refusals: dict[int, str],
                         open_answer: Callable[[Any, ShardInfo], T], *,
                         headers: dict[str, str] | None = None) -> T | None:
        """One shard's answer to a release or decryption request, opened by ``open_answer``;
        None (with the reason in ``refusals``) when the shard is unreachable, refuses, or
        answers something malformed, mis-signed or undecryptable: the caller asks another."""
        shard = self.shards[idx]
        try:
            status, data = await self._post(http, f"{shard.url}{path}", body, headers)
        except httpx.HTTPError as e:
            refusals[idx] = f"unreachable: {type(e).__name__}: {e}"
            return None
        except ShardAnswerError as e:
            refusals[idx] = f"bad_answer: {e}"
            return None
        if status != 200:
            refusals[idx] = _reason(status, data)
            return None
        try:
            return open_answer(_parse(data, f"shard {idx} {what}"), shard)
        except Exception as e:  # malformed, mis-signed or undecryptable: skip this shard
            refusals[idx] = f"bad_release: {type(e).__name__}: {getattr(e, 'message', e)}"
            return None

    async def _post(self, http: httpx.AsyncClient, url: str, body: Any,
                    headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """POST and read the answer up to MAX_ANSWER_BYTES within ``timeout_s`` overall (httpx's
        timeout is per read: a shard dripping bytes would otherwise hold the runner)."""
        async def go() -> tuple[int, bytes]:
            # identity encoding: the size bound then holds for what we parse (no gzip bombs)
            async with http.stream("POST", url, json=body,
                                   headers={**(headers or {}),
                                            "accept-encoding": "identity"}) as r:
                if r.headers.get("content-encoding", "identity").lower() != "identity":
                    raise ShardAnswerError("answer is content-encoded although identity was "
                                           "asked for")
                declared = r.headers.get("content-length")
                if declared is not None and declared.isdigit() \
                        and int(declared) > MAX_ANSWER_BYTES:
                    raise ShardAnswerError(f"answer of {declared} bytes exceeds "
                                           f"{MAX_ANSWER_BYTES}")
                buf = bytearray()
                async for chunk in r.aiter_raw():
                    buf += chunk
                    if len(buf) > MAX_ANSWER_BYTES:
                        raise ShardAnswerError(f"answer exceeds {MAX_ANSWER_BYTES} bytes")
                return r.status_code, bytes(buf)

        try:
            return await asyncio.wait_for(go(), self.timeout_s)
        except TimeoutError:
            raise ShardAnswerError(f"no complete answer within {self.timeout_s}s") from None

    def _open_release(self, d: Any, shard: ShardInfo, epoch: int, rd: bytes,
                      ephemeral: X25519PrivateKey) -> bytearray:
        rel = Release.from_json(d)
        if rel.epoch != epoch or rel.shard_index != shard.index or rel.report_data != rd:
            raise ValueError(f"release from shard {shard.index} answers another request")
        signer = recover_eip191_signer(release_digest(rel.unsigned_json()), rel.signature)
        if signer != shard.address or rel.shard_address != shard.address:
            raise ValueError(f"release signed by {signer}, shard {shard.index} is {shard.address}")
        pt = TRANSPORT_SUITE.decrypt(rel.encrypted_share, ephemeral,
                                     info=share_info(epoch, shard.index, rd))
        if len(pt) != 32:
            raise ValueError(f"share from shard {shard.index} is {len(pt)} bytes, not 32")
        return bytearray(pt)

    def _rebuild(self, record: EpochRecord, shares: list[Share], buffers: list[bytearray],
                 corrupt: list[int], refusals: dict[int, str]) -> EpochKey:
        seed = bytearray(32)
        try:
            secret = reconstruct(shares, record.threshold)
            if public_key_of(secret) != record.commitment_bytes[0]:  # cannot happen if the
                raise EnclaveError("reconstructed secret does not match C_0")  # checks passed
            seed[:] = secret.to_bytes(32, "big")
            private, public = app_keypair(seed, record.suite)
            if public.to_bytes() != record.public_key_bytes:
                raise EnclaveError(f"epoch {record.epoch}: derived app key does not match the "
                                   "registered public key")
        except BaseException:
            wipe_all([*buffers, seed])
            raise
        return EpochKey(record.epoch, private, sorted(s.index for s in shares), corrupt,
                        refusals, [*buffers, seed])


def _parse(data: bytes, what: str) -> Any:
    return loads_untrusted(data, max_bytes=MAX_ANSWER_BYTES, depth=MAX_ANSWER_DEPTH, what=what)


def _reason(status: int, data: bytes) -> str:
    """The refusal reason a shard gave, or ``http_<status>`` if its answer is not a refusal.
    Only short ``[a-z0-9_]`` reasons are taken: the text ends up in our errors and logs."""
    try:
        reason = loads_untrusted(data, max_bytes=MAX_ANSWER_BYTES, depth=MAX_ANSWER_DEPTH,
                                 what="shard refusal")["error"]["reason"]
    except (UntrustedJsonError, KeyError, TypeError):
        return f"http_{status}"
    if isinstance(reason, str) and 0 < len(reason) <= 64 \
            and all(c.islower() or c.isdigit() or c == "_" for c in reason) and reason.isascii():
        return reason
    return f"http_{status}"


async def _ask_until(queue: list[int], need: int,
                     ask: Callable[[int], Awaitable[A | None]],
                     accept: Callable[[int, A], bool]) -> None:
    """Asks the shards of ``queue`` in order, never more at once than answers are still
    missing, until ``need`` answers were accepted or the queue ran dry. A shard that fails
    (``ask`` gives None) or whose answer ``accept`` refuses is replaced by the next one;
    questions still in flight when enough answers are in are cancelled."""
    accepted = 0
    pending: set[asyncio.Task[tuple[int, A | None]]] = set()

    async def one(idx: int) -> tuple[int, A | None]:
        return idx, await ask(idx)

    queue = list(queue)
    try:
        while accepted < need:
            while queue and len(pending) + accepted < need:
                pending.add(asyncio.create_task(one(queue.pop(0))))
            if not pending:
                break
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                idx, answer = task.result()
                if answer is not None and accept(idx, answer):
                    accepted += 1
    finally:
        for task in pending:
            task.cancel()


def _describe(refusals: dict[int, str]) -> str:
    return ", ".join(f"shard {i}: {why}" for i, why in sorted(refusals.items())) or "no refusals"


def new_challenge_id() -> str:
    return "0x" + secrets.token_hex(32)
