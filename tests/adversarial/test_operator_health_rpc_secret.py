"""Anyone reads the operator's chain RPC credentials off its public /health.

The operator's readiness monitor runs its checks (the chain identity of each model, ...) every
second; a check that raises is recorded as a blocker with ``check failed: <exception>``, and
every blocker's reason is served by the unauthenticated ``/health`` (``not_ready``) and named in
the 503 ``operator_not_ready`` a client gets. When the check's chain read fails, the exception
is requests' own, which spells the RPC URL's path and query (``Max retries exceeded with url:
/v2/<key>?apikey=<key>``): a hosted RPC's API key, served to anyone during an RPC outage. The
coverage check of a receipt's engine fingerprint (``runtime.py``) put the same text in the
``NotReadyError`` sent to the client.

Fix: ``Readiness.block`` and ``NotReadyError`` pass their text through
``verinfer.httpserve.redact_urls`` (a URL keeps its scheme, host and port; requests' ``with
url: …`` part and a URL's user info, path and query become ``…``).
"""

from __future__ import annotations

import socket

import pytest
from web3 import Web3

from verinfer.operator.readiness import MonitorThread, NotReadyError, Readiness

SECRETS = ("PATHKEY5521", "QUERYKEY7730", "PASSWORD1193")


def _keyed_dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])  # closed again: nothing listens there
    return f"http://user:{SECRETS[2]}@127.0.0.1:{port}/v2/{SECRETS[0]}?apikey={SECRETS[1]}"


def test_a_failed_chain_check_does_not_show_the_rpc_credentials() -> None:
    url = _keyed_dead_url()
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 2}))

    def chain_identity() -> None:
        w3.eth.chain_id  # noqa: B018  # the read a chain check makes

    readiness = Readiness()
    MonitorThread(readiness, [("identity", chain_identity)]).run_once()
    reason = readiness.reasons()["identity"]
    assert "check failed" in reason and "127.0.0.1" in reason, reason
    for secret in SECRETS:
        assert secret not in reason, (secret, reason)
    with pytest.raises(NotReadyError) as e:
        readiness.require()
    for secret in SECRETS:
        assert secret not in e.value.message, (secret, e.value.message)

    try:
        w3.eth.chain_id  # noqa: B018
    except Exception as err:  # what runtime.py's coverage check wraps for the client
        direct = NotReadyError(f"cannot read the coverage from the chain: {err}", retry_after=3)
    for secret in SECRETS:
        assert secret not in direct.message, (secret, direct.message)
    assert "cannot read the coverage" in direct.message
