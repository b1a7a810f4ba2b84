"""A compromised SoftwareEnclave child against its parent (the verifier node, which holds the
verifier's account key). Before: the parent read the child's answer with ``Connection.recv()``,
i.e. unpickled it — a child (which runs the engine on operator-supplied evidence) could run any
code in the parent — and parsed nothing itself. Now every child message is length-bounded,
parsed with loads_untrusted, shape-checked, and refused with a typed EnclaveError.

The children are real spawned processes (tests/adversarial/enclave_evil_child.py)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from eth_account import Account

from adversarial.enclave_evil_child import evil_child
from verinfer.enclave.errors import EnclaveError
from verinfer.enclave.process import MAX_SIGN_REQUESTS, EnclaveSpec, SoftwareEnclave
from verinfer.enclave.runner import AccountSigner
from verinfer.kms.identity import recover_eip191_signer

ACCOUNT = Account.from_key(hashlib.sha256(b"verifier behind a hostile enclave").digest())


class HostileEnclave(SoftwareEnclave):
    child_main = staticmethod(evil_child)


@pytest.fixture
def enclave(tmp_path: Path) -> HostileEnclave:
    spec = EnclaveSpec(tmp_path / "root.key", "sha256:" + "00" * 32, "code", "{}",
                       tmp_path / "shards.json", tmp_path / "epochs.json")
    return HostileEnclave(spec, AccountSigner(ACCOUNT))


@pytest.fixture
def eth_account_recursion_limit() -> Iterator[None]:
    """The condition of the bracket bomb: importing eth-account sets the limit to 100000."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    yield
    sys.setrecursionlimit(before)


def _run(enclave: SoftwareEnclave, how: str, **args: str) -> object:
    return enclave.run(how, args, epoch=1, purpose="full_challenge", challenge_id="c1",
                       timeout_s=60)


def test_a_pickle_from_the_child_is_not_run_in_the_parent(enclave: HostileEnclave,
                                                          tmp_path: Path) -> None:
    marker = tmp_path / "the-child-ran-code-in-the-parent"
    with pytest.raises(EnclaveError, match="unreadable"):
        _run(enclave, "pickle", marker=str(marker))
    assert not marker.exists()


def test_a_bracket_bomb_from_the_child_is_refused_not_a_crash(
        enclave: HostileEnclave, eth_account_recursion_limit: None) -> None:
    with pytest.raises(EnclaveError, match="depth"):
        _run(enclave, "bomb")


@pytest.mark.parametrize(("how", "match"), [
    ("oversize", "over"),
    ("no-kind", "without a kind"),
    ("constructor", "unknown result type"),
    ("bad-shards", "shards_used"),
    ("bad-envelope", "undecodable result"),
    ("sign-bad-digest", "40 bytes, not 32"),
    ("sign-flood", f"more than {MAX_SIGN_REQUESTS} signatures"),
])
def test_malformed_child_messages_are_typed_errors(enclave: HostileEnclave, how: str,
                                                   match: str) -> None:
    with pytest.raises(EnclaveError, match=match):
        _run(enclave, how)


def test_a_well_formed_answer_still_gets_through(enclave: HostileEnclave) -> None:
    out = _run(enclave, "sign-then-result")
    sig = bytes.fromhex(out.result["signature"][2:])  # type: ignore[attr-defined]
    assert recover_eip191_signer(b"\xab" * 32, sig) == ACCOUNT.address.lower()
    assert out.shards_used == [1, 2, 3]  # type: ignore[attr-defined]
