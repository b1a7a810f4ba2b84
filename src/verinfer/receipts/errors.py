"""Typed errors of the receipts part. Each carries the offending value in its message.

All are the caller's fault (:class:`~verinfer.errors.BadInputError`): a receipt, signature,
proof or envelope handed in is wrong. Whether that is a 400, an exit code 2 or evidence against
an operator is decided where it is caught."""

from __future__ import annotations

from verinfer.errors import BadInputError

# the format errors (ReceiptFormatError, UnsupportedVersionError, NonCanonicalEncodingError)
# live with the ExecRequest in the protocol layer: import them from verinfer.protocol.errors
from verinfer.protocol.errors import ReceiptFormatError


class SignatureError(BadInputError):
    """A signature is malformed, does not recover, or recovers to the wrong signer."""

    code = "invalid_signature"


class WrongChainError(SignatureError):
    """A receipt names another chain than the EIP-712 domain it is signed under (or than the
    chain being read). Such a receipt is valid-looking off chain but the contracts refuse every
    dispute about it (``WrongChainId``), so whoever accepts it can never get its signer slashed."""

    code = "wrong_chain"


class IssuedAtSkewError(ReceiptFormatError):
    """A receipt or report claims an ``issuedAt`` too far in the future. Its publication and
    challenge windows start then, so it could never be claimed as withheld in time."""

    code = "issued_at_skew"


class MerkleError(BadInputError):
    """A Merkle batch or proof is invalid (empty batch, index out of range, bad siblings)."""

    code = "invalid_merkle_proof"


class EnvelopeDecryptionError(BadInputError):
    """The envelope could not be opened. Deliberately opaque: wrong key, wrong receipt binding,
    truncation and tampering all look the same, so the error is no decryption oracle."""

    code = "envelope_decryption_failed"

    def __init__(self) -> None:
        super().__init__("the envelope could not be opened")


class EnvelopeContentError(BadInputError):
    """The envelope opened (so its sealer had the binding) but what it holds is malformed or
    does not hash to the receipt's req_hash/out_hash: evidence against the operator."""

    code = "envelope_content_mismatch"


class EncapsulationError(EnvelopeDecryptionError):
    """A P-256 envelope's encapsulated key E or its proof of knowledge of log_G(E) is not
    acceptable (``receipts/encapsulation.py``). An envelope that cannot be opened, like its
    parent, but it says why: everything checked is public (E, the proof, the receipt
    binding), so the message is no decryption oracle."""

    code = "encapsulation_invalid"

    def __init__(self, message: str) -> None:
        BadInputError.__init__(self, message)


class EncapsulationMalformedError(EncapsulationError):
    """E is not a P-256 point other than the identity, or the proof is not two scalars < n."""

    code = "encapsulation_malformed"


class EncapsulationProofError(EncapsulationError):
    """The proof is well formed but does not verify for this envelope and receipt binding: it
    was made for another envelope (a foreign E copied with its proof) or forged."""

    code = "encapsulation_proof_invalid"


class ReusedEncapsulationError(EncapsulationError):
    """At least t KMS shards refused the envelope because they had already decrypted another
    envelope (another ciphertext) with the same E. Fewer than t shards are assumed faulty, so
    one honest shard saw two envelopes whose proofs of knowledge of log_G(E) both verified:
    only the holder of e can make them, i.e. the sealer reused its ephemeral key."""

    code = "encapsulation_reused"
