"""OPEN (verifier, not fixed here): a cheating operator overwrites its own DA blob with junk.

The operator runs its Redis DA store (docs/da.md: "An operator must run it with ..."), so it
can ``SET`` any bytes under the content key of a receipt's ciphertext once the receipt is
challenged. Every verifier's ``get`` then raises ``CommitmentMismatchError`` (the bytes do not
hash to the pointer), which ``verifier/enclave_judge.fetch_blob`` (and
``chain_view.challenge_manifest`` for a manifest) classifies as the verifier's own DA trouble
(``EvidenceUnavailableError``, a LocalFault retried until the commit window closes): no member
votes, the challenge ends inconclusive and the cheat keeps its stake — against the verifier's
own rule "a member never abstains because of something the operator controls"
(docs/verifier.md). Nothing is gained by a DA man-in-the-middle that it could not already get
by answering "not found", so the fix is to count a mismatch on an operator-hosted,
content-addressed backend (local, redis) as absent — ``ciphertext_unavailable`` /
``manifest_unavailable`` once the publication window has passed. That code is the verifier's
(src/verinfer/verifier/enclave_judge.py ``fetch_blob``, chain_view.py ``challenge_manifest``);
this test pins the attack and fails (xfail strict) until it is fixed there.
"""

from __future__ import annotations

import hashlib
import uuid

import pytest

from verinfer.da_client.factory import DARouter
from verinfer.da_client.redis_backend import RedisDAClient
from verinfer.verifier.enclave_judge import fetch_blob


@pytest.mark.xfail(strict=True, reason="verifier classifies operator-controlled DA bytes as a "
                   "local fault (see module docstring)")
def test_junk_under_the_operators_own_key_counts_as_absent() -> None:
    redis = pytest.importorskip("redis")
    r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        r.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    client = RedisDAClient(prefix=f"vi-test-overwrite-{uuid.uuid4().hex}:", retention_s=60)
    blob = b"VIE\x01" + hashlib.sha256(b"ciphertext").digest()
    pointer = client.put(blob)
    try:
        r.set(client.key(pointer), b"junk the operator wrote after the challenge", ex=60)
        # absent (None) is what the verifier votes on once the window has passed
        assert fetch_blob(DARouter([client]), str(pointer)) is None
    finally:
        r.delete(client.key(pointer))
        client.close()
        r.close()
