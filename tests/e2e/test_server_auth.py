"""API keys and per-key rate limits on a real server, through the openai SDK."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from support.servers import running_server


def test_api_keys_and_rate_limits(tiny_path: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-alpha\nsk-beta\n")
    with running_server(tiny_path, "--api-keys-file", str(keys), "--rate-limit", "6",
                        "--unsafe-no-evidence") as base:
        with pytest.raises(openai.AuthenticationError) as e:
            OpenAI(base_url=base + "/v1", api_key="sk-wrong", max_retries=0).models.list()
        assert isinstance(e.value.body, dict) and e.value.body["code"] == "invalid_api_key"
        r = httpx.get(base + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"

        alpha = OpenAI(base_url=base + "/v1", api_key="sk-alpha", max_retries=0)
        assert alpha.models.list().data[0].id == "tiny"  # burst of 1 (6/min): now empty
        with pytest.raises(openai.RateLimitError) as e:
            alpha.models.list()
        assert int(e.value.response.headers["retry-after"]) >= 1
        # Limits are per key: beta still has its own budget.
        beta = OpenAI(base_url=base + "/v1", api_key="sk-beta", max_retries=0)
        assert beta.models.list().data[0].id == "tiny"
        assert httpx.get(base + "/health").status_code == 200  # health needs no key
