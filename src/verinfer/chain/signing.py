"""Operator-side receipt signing with eth-account's EIP-712 implementation.

`verinfer.receipts.eip712` computes the same digest by hand; signing here goes through
`Account.sign_typed_data` on the full typed-data JSON so wallets and the contract agree.
"""

from __future__ import annotations

from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount

from verinfer.receipts.eip712 import Domain, Receipt


def typed_data_digest(receipt: Receipt, domain: Domain) -> bytes:
    """keccak256(0x1901 || domainSeparator || structHash) as eth-account computes it."""
    from eth_utils import keccak

    msg = encode_typed_data(full_message=receipt.as_typed_data(domain))
    return bytes(keccak(b"\x19" + msg.version + msg.header + msg.body))


def sign_receipt_typed(receipt: Receipt, domain: Domain, account: LocalAccount) -> bytes:
    """65-byte r||s||v (v in {27, 28}, low s) signature over the receipt."""
    signed = Account.sign_typed_data(account.key, full_message=receipt.as_typed_data(domain))
    return bytes(signed.signature)
