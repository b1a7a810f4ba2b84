"""Fixtures that run a real `verinfer serve` process on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from support.servers import operator_init, running_server


@pytest.fixture(scope="module")
def operator_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("operator")
    operator_init(d)
    return d


@pytest.fixture(scope="module")
def server(tiny_path: Path, operator_dir: Path) -> Iterator[str]:
    with running_server(tiny_path, "--operator-dir", str(operator_dir)) as base:
        yield base


@pytest.fixture()
def client(server: str) -> OpenAI:
    return OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
