"""Loading the signing key for chain transactions: a keystore file or an environment variable."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from verinfer.chain.errors import KeyLoadError

KEY_ENV = "VERINFER_CHAIN_PRIVATE_KEY"
PASSWORD_ENV = "VERINFER_KEYSTORE_PASSWORD"


def load_account(keystore: Path | None = None, *,
                 env: Mapping[str, str] | None = None) -> LocalAccount:
    """From `keystore` (password in $VERINFER_KEYSTORE_PASSWORD) or else from the hex key in
    $VERINFER_CHAIN_PRIVATE_KEY."""
    env = os.environ if env is None else env
    if keystore is not None:
        password = env.get(PASSWORD_ENV)
        if password is None:
            raise KeyLoadError(f"keystore {keystore} given but ${PASSWORD_ENV} is not set",
                               param="keystore")
        try:
            key = Account.decrypt(json.loads(keystore.read_text()), password)
        except (OSError, ValueError) as e:
            raise KeyLoadError(f"cannot decrypt keystore {keystore}: {e}",
                               param="keystore") from e
        return Account.from_key(key)
    raw = env.get(KEY_ENV)
    if not raw:
        raise KeyLoadError(f"no key: pass --keystore FILE or set ${KEY_ENV}", param="key")
    try:
        return Account.from_key(raw)
    except (ValueError, TypeError) as e:
        raise KeyLoadError(f"${KEY_ENV} is not a valid secp256k1 private key",
                           param="key") from e
