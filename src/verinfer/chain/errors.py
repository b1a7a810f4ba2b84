"""Typed errors of the chain bindings: :class:`ChainError` where the node or the toolchain
failed, :class:`~verinfer.errors.BadInputError` where the caller's input (a key, a deployment
file, a transaction the contracts refuse) is wrong. No HTTP here: edges map them."""

from __future__ import annotations

from verinfer.errors import BadInputError, VerinferError


class ChainError(VerinferError):
    """The node or the toolchain failed (RPC down, build failed, transaction not mined)."""

    code = "chain_error"


class ArtifactsMissingError(ChainError):
    """Compiled contracts are missing and could not be built (run scripts/bootstrap-contracts)."""

    code = "contract_artifacts_missing"


class AnvilError(ChainError):
    """The local anvil process could not be started or did not answer."""

    code = "anvil_error"


class ContractRevertError(BadInputError):
    """A contract call reverted; `error_name`/`error_args` carry the decoded custom error."""

    code = "contract_revert"

    def __init__(self, message: str, *, error_name: str, error_args: tuple[object, ...],
                 data: bytes) -> None:
        super().__init__(message)
        self.error_name = error_name
        self.error_args = error_args
        self.data = data


class KeyLoadError(BadInputError):
    """A private key could not be loaded from the keystore file or the environment."""

    code = "key_load_error"


class DeploymentFileError(BadInputError):
    """A deployment JSON file is missing or malformed."""

    code = "deployment_file_error"


class StakeActionError(BadInputError):
    """A stake action was asked for with arguments it cannot take (a missing, non-positive or
    superfluous amount; a role other than operator or verifier)."""

    code = "invalid_stake_action"


class RpcDeadlineError(ChainError):
    """A chain call (all its RPC requests together, a transaction's wait included) did not
    finish within its whole-call deadline: the node is stuck or too slow."""

    code = "rpc_deadline"
