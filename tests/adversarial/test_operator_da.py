"""Issue 24.7: a lying EigenDA proxy (certifies a blob, then cannot serve it, or serves other
bytes) must not make the operator commit a batch naming that pointer — it would be liable for
an unpublished receipt. The publisher reads every EigenDA put back; the lie is an error, logged and
retried, and the batch is committed only once its manifest really is retrievable."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from verinfer.da_client.eigenda import EigenDAProxyClient
from verinfer.da_client.local import LocalDAClient
from verinfer.da_client.manifest import parse_manifest
from verinfer.da_client.outbox import Outbox
from verinfer.da_client.publisher import Backoff, Publisher
from verinfer.testing.eigenda_fake_proxy import FakeEigenDAProxy
from verinfer.testing.sample import sample_entry
from verinfer.testing.sinks import InMemoryBatchSink


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


@pytest.mark.parametrize("lie", ["lie_on_puts", "corrupt_gets"])
def test_lying_proxy_never_gets_a_batch_committed(tmp_path: Path, lie: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    sink = InMemoryBatchSink()
    with FakeEigenDAProxy() as proxy, Outbox(tmp_path / "outbox.db", now=clock.now) as outbox:
        eigenda = EigenDAProxyClient(proxy.url, timeout_s=5)
        local = LocalDAClient(tmp_path / "da")
        pub = Publisher(outbox, local, sink, manifest_da=eigenda, batch_max_entries=2,
                        batch_max_age_s=0.0, backoff=Backoff(1.0, 2.0, 8.0, 0.0),
                        put_workers=1, now=clock.now, sleep=clock.sleep)
        entries = [sample_entry(os.urandom(32)) for _ in range(2)]
        outbox.enqueue_many(entries)
        setattr(proxy, lie, True)
        with caplog.at_level(logging.ERROR, logger="verinfer.da_client.eigenda"):
            for _ in range(5):
                pub.run_once()
                clock.t += 1.0
        assert sink.batches == []  # the certificate was never trusted
        st = outbox.status()
        assert st.batches["built"] == 1 and st.batches["committed"] == 0
        assert st.last_error is not None and ("404" in st.last_error
                                              or "CommitmentMismatch" in st.last_error)
        assert any("eigenda proxy" in r.getMessage() for r in caplog.records)
        puts_while_lying = proxy.puts
        assert puts_while_lying >= 2  # retried, with backoff

        setattr(proxy, lie, False)  # the proxy behaves: the same batch goes through
        for _ in range(20):
            pub.run_once()
            if sink.batches:
                break
            clock.t += 1.0
        assert len(sink.batches) == 1
        manifest = parse_manifest(eigenda.get(sink.batches[0].manifest))
        assert {e.signed.digest for e in manifest.entries} == {d for d, _, _ in entries}
        eigenda.close()
