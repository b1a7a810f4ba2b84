"""Building blocks of a local verinfer network, shared by `verinfer devnet`, the e2e tests and
bench/challenge.py: deploy the contracts on anvil, provision and start a t-of-n KMS whose epoch
is registered on chain, stake an operator and verifiers, and publish batches.

Every component is real: anvil (npm @foundry-rs/anvil), the Solidity contracts, KMS shard
processes, the SQLite local DA store; the SoftwareEnclave is not a security boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from web3 import Web3

from verinfer.attestation.quotes import measurement
from verinfer.chain.anvil import dev_accounts
from verinfer.chain.bindings import Contracts, TxSender
from verinfer.chain.deploy import Deployment, deploy_all
from verinfer.chain.stake import ensure_declared
from verinfer.chain.structs import ETHER, MIN_COVERAGE_BPS, Kind, Params, Role, default_params
from verinfer.da_client.base import DAClient
from verinfer.da_client.manifest import ManifestEntry, build_manifest
from verinfer.engine.engine import Engine
from verinfer.engine.fingerprint import EngineFingerprint
from verinfer.kms.epochs import EpochRecord, FileEpochRegistry
from verinfer.kms.local_cluster import ClusterLayout, provision
from verinfer.receipts.epoch_keys import EnvelopeSuite, EpochPublicKey, load_public_key
from verinfer.testing.evidence import Evidence

CONTAINER_DIGEST = "sha256:" + "00" * 32  # devnet: no container image
CODE_HASH = "verinfer-devnet"


def devnet_params(committee_size: int = 4) -> Params:
    """Short phases (the devnet moves through them with evm_increaseTime when it must)."""
    p = default_params()
    return Params(**{**p.__dict__, "committee_size": committee_size, "commit_period": 300,
                     "reveal_period": 300, "draw_period": 600, "draw_delay_blocks": 2,
                     "challenge_window": 3600, "publication_deadline": 600,
                     "response_period": 600})


@dataclass(frozen=True)
class Roles:
    governance: LocalAccount
    operator: LocalAccount
    challenger: LocalAccount
    verifiers: tuple[LocalAccount, ...]


def roles(n_verifiers: int) -> Roles:
    a = dev_accounts(3 + n_verifiers)
    return Roles(a[0], a[1], a[2], tuple(a[3:]))


def bind(w3: Web3, d: Deployment, who: LocalAccount | None = None) -> Contracts:
    return d.bind(w3, TxSender(w3, who) if who is not None else None)


def enclave_measurement(engine_fingerprint: str) -> bytes:
    return measurement(CONTAINER_DIGEST, CODE_HASH, engine_fingerprint)


def deploy_network(w3: Web3, r: Roles, engine: Engine, params: Params,
                   more_model_ids: Sequence[bytes] = (),
                   fingerprints: Sequence[EngineFingerprint] = ()) -> Deployment:
    """Deploys, approves the engine's model (and ``more_model_ids``, 32 bytes each: the other models
    the operator serves — the engine fingerprint depends on the kernels, not the model, so
    one approval covers them all) and fingerprint, stakes the operator. ``fingerprints``: the
    engine fingerprints to approve instead of the engine's (another backend's, one per model
    where it names the weights, as vLLM's does), each with its enclave measurement."""
    # No coverage notice: the devnet's operator signs (on its wall clock) right after its
    # verifiers declared; production deployments read coverage COVERAGE_NOTICE earlier. The
    # production coverage share: every devnet verifier declares every approved (fingerprint,
    # model) pair (register_verifiers), so each pool holds all of the verifier stake.
    d = deploy_all(w3, r.governance, params, coverage_notice_s=0,
                   min_coverage_bps=MIN_COVERAGE_BPS)
    gov = bind(w3, d, r.governance)
    for mid in dict.fromkeys([engine.model_id, *more_model_ids]):  # once each, in order
        gov.config.approve(Kind.MODEL, mid)
    for fp in _distinct(fingerprints or [engine.fingerprint]):
        gov.config.approve(Kind.ENGINE_FINGERPRINT, fp.hash)
        gov.config.approve(Kind.ENCLAVE_MEASUREMENT,
                           enclave_measurement(fp.canonical().decode()))
    bind(w3, d, r.operator).stakes.register(Role.OPERATOR, 20 * ETHER)
    return d


def register_verifiers(w3: Web3, d: Deployment, r: Roles, pairs: Sequence[tuple[bytes, bytes]],
                       stake_wei: int = ETHER) -> None:
    """Registers each verifier of ``r`` (unless registered) and declares ``pairs`` (the
    approved (engine fingerprint hash, model id) pairs the devnet's verifiers run), before the
    operator signs anything: a receipt signed while its (fingerprint, model) has no declared
    verifier is invalid on its face (slashed at open), and committees are drawn only from the
    verifiers declared for it."""
    for v in r.verifiers:
        c = bind(w3, d, v)
        if c.stakes.account_of(v.address).role is not Role.VERIFIER:
            c.stakes.register(Role.VERIFIER, stake_wei)
        ensure_declared(c, v.address, pairs)


def _distinct(fps: Sequence[EngineFingerprint]) -> list[EngineFingerprint]:
    return list({fp.hash: fp for fp in fps}.values())


def provision_kms(root: Path, engine: Engine, *, shares: int = 5, threshold: int = 3,
                  epoch: int = 1, fingerprints: Sequence[EngineFingerprint] = ()
                  ) -> ClusterLayout:
    """The KMS allowlists the enclave measurement of each of ``fingerprints`` (default: the
    engine's)."""
    return provision(root, epoch=epoch, threshold=threshold, shares=shares,
                     measurements=[enclave_measurement(fp.canonical().decode())
                                   for fp in _distinct(fingerprints or [engine.fingerprint])],
                     # per-receipt threshold decryption: no verifier ever holds the epoch key
                     suite=EnvelopeSuite.P256.value, unsafe_single_tree=True)


def register_epoch(w3: Web3, d: Deployment, r: Roles, lay: ClusterLayout, epoch: int = 1
                   ) -> EpochRecord:
    rec = FileEpochRegistry(lay.registry).get(epoch)
    bind(w3, d, r.governance).config.register_key_epoch(
        epoch, rec.public_key_bytes, keccak(b"".join(rec.commitment_bytes)), rec.threshold,
        rec.shares)
    return rec


def epoch_public_key(rec: EpochRecord) -> EpochPublicKey:
    return load_public_key(rec.suite, rec.public_key_bytes)


def publish_batch(da: DAClient, contracts: Contracts, evs: Sequence[Evidence],
                  withheld: Sequence[Evidence] = ()) -> str:
    """What the operator's Publisher does: ciphertexts to DA, a manifest, the root on chain.
    Returns the manifest pointer. ``withheld`` receipts are signed but left out."""
    entries = [ManifestEntry(e.signed, da.put(e.blob)) for e in evs if e not in withheld]
    manifest = build_manifest(entries)
    pointer = da.put(manifest.to_bytes())
    contracts.batches.commit_batch(manifest.root, manifest.leaf_count, str(pointer))
    return str(pointer)
