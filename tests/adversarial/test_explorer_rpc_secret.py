"""Anyone reads the explorer operator's RPC credentials off the explorer's public pages.

Hosted chain RPCs carry their API key in the URL (``https://…/v2/<key>``, ``?apikey=``,
``user:password@``). When the explorer's chain follower fails, it shows why in every page's
footer and in ``/api/status`` (``follower_error``), and that text was the exception's own:
requests/urllib3 spell the URL's path and query in it (``Max retries exceeded with url:
/v2/<key>?apikey=<key>``). Measured: ``verinfer explorer --rpc-url
http://127.0.0.1:9/v2/SECRETKEY123`` served ``SECRETKEY123`` on ``/`` and ``/api/status`` to any
visitor as soon as one RPC call failed; an outsider who can make the RPC fail (or just waits for
an outage) reads the key and spends the operator's RPC quota.

Fix: the pages show the follower's error with the RPC URL's user info, path and query replaced
by ``…`` (``views.redact_rpc``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from verinfer.ports import free_port
from verinfer.testing.hostile import fake_deployment

SECRETS = ("PATHKEY7731", "QUERYKEY9120", "PASSWORD5531")


def test_follower_errors_do_not_show_the_rpc_credentials(tmp_path: Path) -> None:
    dead = free_port()  # nothing listens: every RPC call fails at once
    rpc = f"http://user:{SECRETS[2]}@127.0.0.1:{dead}/v2/{SECRETS[0]}?apikey={SECRETS[1]}"
    port = free_port()
    log = (tmp_path / "explorer.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "verinfer", "explorer", "--rpc-url", rpc,
                             "--deployment", str(fake_deployment(tmp_path / "dep.json")),
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        state: dict[str, object] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "explorer.log").read_text()
            try:
                state = httpx.get(base + "/api/status", timeout=2).json()
                if state.get("follower_error"):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert state.get("follower_error"), state  # the error is still shown ...
        page = httpx.get(base + "/", timeout=10).text
        for where, text in (("/api/status", json.dumps(state)), ("/", page)):
            for secret in SECRETS:  # ... without the credentials in the URL
                assert secret not in text, (where, secret, state["follower_error"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
