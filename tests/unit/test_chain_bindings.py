"""Offline parts of verinfer.chain: revert decoding, params, keys, amounts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from eth_abi import encode
from eth_account import Account
from eth_utils import keccak

from verinfer.chain.artifacts import decode_revert
from verinfer.chain.bindings import vote_commitment
from verinfer.chain.cli import parse_ether
from verinfer.chain.errors import KeyLoadError
from verinfer.chain.keys import KEY_ENV, PASSWORD_ENV, load_account
from verinfer.chain.structs import ETHER, Params, default_params


def test_chain_decode_revert_custom_error_with_values() -> None:
    sel = keccak(text="SignerMismatch(address,address)")[:4]
    a, b = "0x" + "11" * 20, "0x" + "ab" * 20
    name, args = decode_revert(sel + encode(["address", "address"], [a, b]))
    assert name == "SignerMismatch"
    assert [x.lower() for x in args] == [a, b]  # type: ignore[attr-defined]


def test_chain_decode_revert_unknown_selector() -> None:
    assert decode_revert(b"\xde\xad\xbe\xef")[0] == "unknown"
    assert decode_revert(b"")[0] == "empty"


def test_chain_default_params_unbond_outlasts_disputes() -> None:
    p = default_params()
    assert p.unbonding_period > p.max_dispute_span()
    assert Params.from_tuple(p.as_tuple()) == p


def test_chain_vote_commitment_binds_voter() -> None:
    out, salt = b"\x01" * 32, b"\x02" * 32
    assert vote_commitment(1, "0x" + "11" * 20, out, salt) != \
        vote_commitment(1, "0x" + "22" * 20, out, salt)
    assert vote_commitment(1, "0x" + "11" * 20, out, salt) != \
        vote_commitment(2, "0x" + "11" * 20, out, salt)


def test_chain_parse_ether_exact() -> None:
    assert parse_ether("1.5") == 3 * ETHER // 2
    assert parse_ether("0.000000000000000001") == 1
    for bad in ("0", "-1", "abc", "0.0000000000000000001"):
        with pytest.raises(typer.BadParameter):
            parse_ether(bad)


def test_chain_load_account_from_env_and_keystore(tmp_path: Path) -> None:
    acct = Account.create()
    assert load_account(env={KEY_ENV: acct.key.hex()}).address == acct.address
    ks = tmp_path / "key.json"
    ks.write_text(json.dumps(Account.encrypt(acct.key, "pw", iterations=2)))
    assert load_account(ks, env={PASSWORD_ENV: "pw"}).address == acct.address
    with pytest.raises(KeyLoadError):
        load_account(ks, env={PASSWORD_ENV: "wrong"})
    with pytest.raises(KeyLoadError):
        load_account(ks, env={})
    with pytest.raises(KeyLoadError):
        load_account(env={})
    with pytest.raises(KeyLoadError):
        load_account(env={KEY_ENV: "0x1234"})
