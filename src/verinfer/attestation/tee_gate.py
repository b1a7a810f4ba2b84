"""Which TEEs a KMS shard accepts, per key epoch, and the one switch that lets the software
enclave (NOT a security boundary) in.

``TeeGate`` wraps the quote verifiers: a quote of a TEE the epoch does not accept is refused
``tee_not_accepted`` before any verification runs. The software enclave is accepted only when
``allow_insecure_software_enclave`` is set (the devnet and tests set it; a production shard
accepts ``tdx``); the shard logs the setting at start and reports it in /health and /metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from verinfer.attestation.errors import UnsupportedTeeError
from verinfer.attestation.quotes import AttestationPolicy, Quote, QuoteVerifier, VerifiedQuote

SOFTWARE = "software"
KNOWN_TEES = ("software", "tdx")


class TeeNotAcceptedError(UnsupportedTeeError):
    code = "tee_not_accepted"


class TeeGate:
    tee = "any"

    def __init__(self, verifiers: Iterable[QuoteVerifier], *, accepted: frozenset[str],
                 per_epoch: Mapping[int, frozenset[str]] | None = None,
                 allow_insecure_software_enclave: bool = False) -> None:
        self._by_tee = {v.tee: v for v in verifiers}
        self.accepted_default = frozenset(accepted)
        self.per_epoch = dict(per_epoch or {})
        self.insecure_software_enclave = allow_insecure_software_enclave
        for tees in (self.accepted_default, *self.per_epoch.values()):
            if SOFTWARE in tees and not allow_insecure_software_enclave:
                raise ValueError("the software enclave is no security boundary: accepting it "
                                 "needs --allow-insecure-software-enclave")
            missing = sorted(t for t in tees if t not in self._by_tee)
            if missing:
                raise ValueError(f"no verifier configured for accepted TEEs {missing}")

    def accepted(self, epoch: int | None) -> frozenset[str]:
        if epoch is not None and epoch in self.per_epoch:
            return self.per_epoch[epoch]
        return self.accepted_default

    def verify(self, quote: Quote, policy: AttestationPolicy) -> VerifiedQuote:
        tees = self.accepted(policy.epoch)
        if quote.tee not in tees or (quote.tee == SOFTWARE
                                     and not self.insecure_software_enclave):
            raise TeeNotAcceptedError(
                f"epoch {policy.epoch}: this shard accepts {sorted(tees)} quotes, not "
                f"{quote.tee!r:.40}")
        return self._by_tee[quote.tee].verify(quote, policy)


def parse_tee_options(values: Iterable[str]) -> tuple[frozenset[str], dict[int, frozenset[str]]]:
    """``--tee`` values: "NAME[,NAME]" for every epoch, "EPOCH=NAME[,NAME]" for one epoch
    (overrides the default for it)."""
    default: set[str] = set()
    per_epoch: dict[int, frozenset[str]] = {}
    for v in values:
        epoch_s, sep, names_s = v.partition("=")
        names = frozenset(n.strip() for n in (names_s if sep else v).split(",") if n.strip())
        unknown = sorted(names - set(KNOWN_TEES))
        if not names or unknown:
            raise ValueError(f"--tee {v!r}: TEEs must be among {list(KNOWN_TEES)}")
        if sep:
            try:
                epoch = int(epoch_s)
            except ValueError as e:
                raise ValueError(f"--tee {v!r}: {epoch_s!r} is not an epoch number") from e
            per_epoch[epoch] = names
        else:
            default |= names
    return frozenset(default), per_epoch


def build_tee_gate(*, tees: Iterable[str], tdx_policy: Path | None,
                   allow_insecure_software_enclave: bool) -> TeeGate:
    """The shard's verifier from its command line. No ``--tee``: the software enclave when
    the insecure flag is set, else an error (a shard must say what it accepts)."""
    default, per_epoch = parse_tee_options(tees)
    if not default and not per_epoch:
        if not allow_insecure_software_enclave:
            raise ValueError("no TEE accepted: give --tee tdx --tdx-policy FILE (or "
                             "--allow-insecure-software-enclave for the software enclave)")
        default = frozenset({SOFTWARE})
    verifiers: list[QuoteVerifier] = []
    if allow_insecure_software_enclave:
        from verinfer.attestation.software import SoftwareQuoteVerifier

        verifiers.append(SoftwareQuoteVerifier())
    if tdx_policy is not None:
        from verinfer.attestation.tdx import TdxPolicy, TdxQuoteVerifier

        verifiers.append(TdxQuoteVerifier(TdxPolicy.load(tdx_policy)))
    return TeeGate(verifiers, accepted=default, per_epoch=per_epoch,
                   allow_insecure_software_enclave=allow_insecure_software_enclave)
