"""A requester sends a KMS shard a release body in which a key appears twice.

The shard parsed release and decryption bodies with ``loads_untrusted`` but without
``unique_keys``: ``{"epoch": "anything", "epoch": 1, ...}`` was read as epoch 1 (the last value
wins in Python; other parsers — a logging proxy, a WAF, an auditor's tool in another language
— take the first or refuse). One body then means one request to the shard and another to
whatever inspected it on the way, which is the ambiguity the operator already refuses
(``request body: not valid JSON (repeated key ...)``). Measured: the shard answered about a
later field (``epoch`` was accepted as 1), not about the repeated key.

Fix: the shard parses its request bodies with ``unique_keys=True``: a repeated key is a 400
``bad_request`` naming the key, before anything else is read.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from adversarial.kms_adversary import make_cluster
from verinfer.kms.local_cluster import ShardProcesses


@pytest.fixture(scope="module")
def shard_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    lay, _ = make_cluster(tmp_path_factory.mktemp("kms-dup"), n=3, t=2)
    with ShardProcesses(lay) as procs:
        procs.start([1])
        yield {s.index: s.url for s in lay.shards_info()}[1]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/release", b'{"epoch": "first", "epoch": 1}'),
    ("/v1/decrypt", b'{"target": {"receipt": 1, "receipt": 2, "ciphertext": ""}}'),
])
def test_a_repeated_key_is_refused_by_name(shard_url: str, path: str, body: bytes) -> None:
    r = httpx.post(shard_url + path, content=body,
                   headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["reason"] == "bad_request" and "repeated key" in err["message"], err
    assert httpx.get(shard_url + "/health", timeout=5).status_code == 200
