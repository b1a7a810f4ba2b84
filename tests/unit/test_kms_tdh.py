"""Threshold DHKEM(P-256) decapsulation (kms/tdh.py): RFC 9180 vectors through the threshold
path, interop with cryptography's HPKE, DLEQ soundness, t−1 shares, bad partials named."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric import ec

from verinfer.kms import tdh
from verinfer.kms.errors import NotEnoughSharesError, ShareVerificationError

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "hpke"
                      / "dhkem-p256-hkdf-sha256-base.json").read_text())


def _deal_known(secret: int, t: int, n: int) -> tuple[list[tdh.ScalarShare], list[bytes], bytes]:
    """deal() with its first draw forced to ``secret`` (the vectors fix skRm)."""
    draws = iter([secret - 1])

    def rng(k: int) -> int:
        return next(draws, None) or secrets.randbelow(k)

    public, shares, commitments = tdh.deal(t, n, rng)
    return shares, commitments, public


def _threshold_dh(shares: list[tdh.ScalarShare], commitments: list[bytes], t: int,
                  enc: bytes, use: list[int]) -> tdh.ECC.EccPoint:
    cpts = tdh.parse_commitments(commitments, t)
    partials = {}
    for sh in shares:
        if sh.index in use:
            ctx = b"test" + sh.index.to_bytes(2, "big")
            raw = tdh.partial_decapsulate(sh, enc, ctx, secrets.randbelow)
            partials[sh.index] = tdh.verify_partial(
                raw, index=sh.index, enc=enc, verification=tdh.verification_key(cpts, sh.index),
                context=ctx)
    return tdh.combine(partials, t)


@pytest.mark.parametrize("v", VECTORS, ids=lambda v: f"aead{v['aead_id']}")
def test_rfc9180_vectors_through_the_threshold_path(v: dict) -> None:
    sk = int(v["skRm"], 16)
    shares, commitments, public = _deal_known(sk, 3, 5)
    assert public.hex() == v["pkRm"]  # C_0 = skRm·G is the vector's recipient key
    enc = bytes.fromhex(v["enc"])
    dh = _threshold_dh(shares, commitments, 3, enc, [2, 4, 5])
    ss = tdh.kem_shared_secret(dh, enc, public)
    assert ss.hex() == v["shared_secret"]
    ks = tdh.key_schedule(ss, bytes.fromhex(v["info"]), v["aead_id"])
    assert (ks.key.hex(), ks.base_nonce.hex(), ks.exporter_secret.hex()) == (
        v["key"], v["base_nonce"], v["exporter_secret"])
    for e in v["encryptions"]:
        pt = tdh.aead_open(ks, v["aead_id"], e["seq"], bytes.fromhex(e["aad"]),
                           bytes.fromhex(e["ct"]))
        assert pt.hex() == e["pt"]


def test_interop_cryptography_hpke_both_ways() -> None:
    """Sealed by cryptography's HPKE (OpenSSL/Rust) to the dealt key: opens through the
    threshold path; and cryptography itself opens it with the full key (test-only)."""
    suite = hpke.Suite(hpke.KEM.P256, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)
    sk = secrets.randbelow(tdh.N - 1) + 1
    shares, commitments, public = _deal_known(sk, 2, 3)
    pub = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), public)
    for info in (b"", b"verinfer/envelope/v1 binding"):
        blob = suite.encrypt(b"private prompt " + info, pub, info)
        enc, ct = blob[:tdh.ENC_LEN], blob[tdh.ENC_LEN:]
        dh = _threshold_dh(shares, commitments, 2, enc, [1, 3])
        assert tdh.open_single_shot(dh, enc, public, info, ct) == b"private prompt " + info
        full = ec.derive_private_key(sk, ec.SECP256R1())
        assert suite.decrypt(blob, full, info) == b"private prompt " + info


def test_t_minus_1_partials_are_refused_and_any_t_agree() -> None:
    shares, commitments, _ = _deal_known(secrets.randbelow(tdh.N - 1) + 1, 3, 5)
    enc = tdh.encode(tdh.base_mult(secrets.randbelow(tdh.N - 1) + 1), compressed=False)
    with pytest.raises(NotEnoughSharesError):
        _threshold_dh(shares, commitments, 3, enc, [1, 2])
    a = _threshold_dh(shares, commitments, 3, enc, [1, 2, 3])
    b = _threshold_dh(shares, commitments, 3, enc, [3, 4, 5])
    assert a.xy == b.xy


def test_bad_partial_is_named() -> None:
    shares, commitments, _ = _deal_known(secrets.randbelow(tdh.N - 1) + 1, 2, 3)
    cpts = tdh.parse_commitments(commitments, 2)
    enc = tdh.encode(tdh.base_mult(7), compressed=False)
    sh = shares[1]
    good = tdh.partial_decapsulate(sh, enc, b"ctx", secrets.randbelow)
    v = tdh.verification_key(cpts, sh.index)
    tdh.verify_partial(good, index=2, enc=enc, verification=v, context=b"ctx")
    # D_i of another share with its own valid-looking proof, a flipped z, another context,
    # another E: each named as shard 2.
    other = tdh.partial_decapsulate(shares[0], enc, b"ctx", secrets.randbelow)
    flipped = good[:-1] + bytes([good[-1] ^ 1])
    enc2 = tdh.encode(tdh.base_mult(8), compressed=False)
    for raw, ctx, e in ((other, b"ctx", enc), (flipped, b"ctx", enc), (good, b"ctx2", enc),
                        (good, b"ctx", enc2), (good[:50], b"ctx", enc)):
        with pytest.raises(ShareVerificationError) as ei:
            tdh.verify_partial(raw, index=2, enc=e, verification=v, context=ctx)
        assert ei.value.shard_index == 2


def test_points_off_curve_are_typed_errors() -> None:
    with pytest.raises(tdh.PointError):
        tdh.point(b"\x04" + bytes(64))
    with pytest.raises(tdh.PointError):
        tdh.point(b"\x02" + b"\xff" * 32)
    with pytest.raises(tdh.PointError):
        tdh.point(b"\x04" * 10)
