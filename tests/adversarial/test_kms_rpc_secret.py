"""Any requester reads a KMS shard's chain RPC credentials out of its refusal.

A shard whose committee comes from the chain (``ChainCommitteeOracle``) answers a failed chain
read with ``committee_unavailable`` and the message ``cannot read <what> from <rpc_url>:
<requests' error>`` — the full ``--rpc-url`` (a hosted RPC's API key in its path or query,
``user:password@``) and again its path and query inside requests' text (``Max retries
exceeded with url: /v2/<key>?apikey=<key>``). The shard sends that message to the requester
(``{"error": {"reason": "committee_unavailable", "message": …}}``), and the read happens for
anyone: the admission of a large ``/v1/decrypt`` body asks ``is_registered_verifier`` of a
signer the requester picks, before anything else. So while the RPC is down (or slow past its
3 s deadline), any outsider learns the shard's RPC key. Measured: the message carried the key
three times.

Fix: the oracle names its RPC by scheme, host and port only, and redacts the URL's user info,
path and query from the cause (``verinfer.httpserve.redact_url``, the explorer's too).
"""

from __future__ import annotations

import socket

import pytest
from web3 import Web3

from verinfer.chain.deploy import Deployment
from verinfer.kms.chain_oracle import ChainCommitteeOracle
from verinfer.kms.errors import CommitteeUnavailableError

SECRETS = ("PATHKEY4471", "QUERYKEY0932", "PASSWORD8817")


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_a_failed_chain_read_does_not_show_the_rpc_credentials() -> None:
    port = _dead_port()
    url = f"http://user:{SECRETS[2]}@127.0.0.1:{port}/v2/{SECRETS[0]}?apikey={SECRETS[1]}"
    a = [Web3.to_checksum_address("0x" + f"{i:02x}" * 20) for i in range(1, 6)]
    d = Deployment(chain_id=31337, protocol_config=a[0], stake_registry=a[1],
                   batch_registry=a[2], challenge_manager=a[3], audit_log=a[4],
                   deployed_block=0)
    oracle = ChainCommitteeOracle.connect(url, d, timeout_s=2.0)
    for read in (oracle.check, lambda: oracle.is_registered_verifier("0x" + "aa" * 20)):
        with pytest.raises(CommitteeUnavailableError) as e:
            read()
        message = e.value.message
        for secret in SECRETS:
            assert secret not in message, (secret, message)
        assert f"127.0.0.1:{port}" in message, message  # still says which node failed
