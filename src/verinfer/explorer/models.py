"""Model names for the model ids approved on chain.

ProtocolConfig's ``Approved`` event names a model by its id alone (0x + the sha256 of its
weights). The names come from two places, in this order of trust:

- the deployment's model list (``--model-names FILE``: ``{"name": "0x<model id>", ...}``),
  written by whoever deployed and approved the models (``verinfer devnet up`` writes one);
- the operator endpoints the explorer watches: ``GET /v1/models/0x<id>`` answers the card of
  the served model with that id, whose ``id`` is the name clients send. That is the
  operator's word: it is shown as such ("per operator endpoint"), only for ids approved on
  chain, and never overrides a name from the deployment's list.

Names are untrusted text: bounded in length and characters, escaped by the templates.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from verinfer.errors import InvalidRequestError
from verinfer.protocol.hexutil import parse_hex

#: Longest model name kept or searched for.
MAX_NAME = 120
#: Names held in all (a list file or endpoints cannot grow the explorer's memory past this).
MAX_NAMES = 1000
DEPLOYMENT = "deployment model list"
ENDPOINT = "per operator endpoint"


@dataclass(frozen=True)
class ModelName:
    name: str
    source: str  # DEPLOYMENT or ENDPOINT (+ the endpoint's URL)


def clean_name(raw: object) -> str | None:
    """A printable, bounded name or None."""
    if not isinstance(raw, str):
        return None
    name = raw.strip()
    if not name or len(name) > MAX_NAME or not name.isprintable():
        return None
    return name


class ModelNames:
    """model id -> name, safe to read from the pages while the prober writes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._names: dict[bytes, ModelName] = {}

    def set(self, model_id: bytes, name: str, source: str) -> bool:
        """Records a name; a deployment name is never replaced by an endpoint's. True if the
        table changed."""
        clean = clean_name(name)
        if clean is None or len(model_id) != 32:
            return False
        with self.lock:
            old = self._names.get(model_id)
            if old is not None and ((old.source == DEPLOYMENT and source != DEPLOYMENT)
                                    or old == ModelName(clean, source)):
                return False
            if old is None and len(self._names) >= MAX_NAMES:
                return False
            self._names[model_id] = ModelName(clean, source)
            return True

    def get(self, model_id: bytes) -> ModelName | None:
        with self.lock:
            return self._names.get(model_id)

    def snapshot(self) -> dict[bytes, ModelName]:
        with self.lock:
            return dict(self._names)

    def missing(self, model_ids: list[bytes]) -> list[bytes]:
        """The ids without a name from the deployment's list (endpoints may still name them)."""
        with self.lock:
            return [m for m in model_ids
                    if (n := self._names.get(m)) is None or n.source != DEPLOYMENT]

    def load_file(self, path: Path) -> int:
        """Reads a deployment's model list: a JSON object name -> model id. A malformed file
        is an InvalidRequestError (the explorer does not start on it)."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise InvalidRequestError(f"cannot read the model list {path}: {e}",
                                      param="model_names") from e
        if not isinstance(data, dict):
            raise InvalidRequestError(f"{path}: a model list is a JSON object name -> "
                                      "0x model id", param="model_names")
        for name, mid in data.items():
            if clean_name(name) is None:
                raise InvalidRequestError(f"{path}: model name {str(name)[:80]!r} is empty, "
                                          f"longer than {MAX_NAME} or not printable",
                                          param="model_names")
            self.set(parse_hex(str(mid), 32, f"model id of {name!r}"), name, DEPLOYMENT)
        return len(data)


def write_model_list(path: Path, names: dict[str, bytes]) -> None:
    """The file ``load_file`` reads (``verinfer devnet up`` and the bench write one)."""
    path.write_text(json.dumps({n: "0x" + m.hex() for n, m in names.items()}, indent=2) + "\n")
