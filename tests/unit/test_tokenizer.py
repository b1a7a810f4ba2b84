"""Unit tests of the pure-Python SentencePiece tokenizer on a tiny vocabulary (no real model)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from verinfer.engine.tokenizer.base import Tokenizer
from verinfer.engine.tokenizer.load import (
    tokenizer_from_gguf,
    tokenizer_from_gguf_fields,
    tokenizer_from_tokenizer_json,
)
from verinfer.engine.tokenizer.spec import (
    SPACE,
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_USER_DEFINED,
    read_gguf_tokenizer_fields,
)
from verinfer.engine.tokenizer.spm import tiny_spm_vocab
from verinfer.engine.tokenizer.stream import StreamDecoder
from verinfer.errors import TokenizerError


def _tok(fields: dict[str, object] | None = None, **overrides: object) -> Tokenizer:
    f = dict(fields if fields is not None else tiny_spm_vocab())
    for k, v in overrides.items():
        f["tokenizer.ggml." + k] = v
    return tokenizer_from_gguf_fields(f)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return _tok()


def _mini(pieces: list[tuple[str, float]], **kw: object) -> Tokenizer:
    """A hand-made vocabulary: control tokens, 256 bytes, then (piece, score)."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"]
    types = [TOKEN_CONTROL] * 4
    scores = [0.0] * 4
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(TOKEN_BYTE)
        scores.append(0.0)
    for p, s in pieces:
        tokens.append(p)
        types.append(TOKEN_NORMAL)
        scores.append(s)
    fields: dict[str, object] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
    }
    fields.update({"tokenizer.ggml." + k: v for k, v in kw.items()})
    return tokenizer_from_gguf_fields(fields)


def _random_text(rng: random.Random, n: int) -> str:
    alphabet = (
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        + list(" \t\n.,;:!?'\"()[]{}<>/_-=+*&^%$#@~`|\\")
        + ["é", "ß", "ñ", "ü", "你", "好", "世", "界", "ا", "ж", "😀", "🎉", "👍🏽", "\u00a0"]
        + ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", " the", " and", "ing", "  "]
    )
    parts = [rng.choice(alphabet) for _ in range(n)]
    # sprinkle arbitrary code points (avoid surrogates)
    for _ in range(rng.randint(0, 3)):
        cp = rng.randint(0x20, 0x10FFFF)
        if not 0xD800 <= cp <= 0xDFFF:
            parts.insert(rng.randint(0, len(parts)), chr(cp))
    return "".join(parts)


# ---- vocabulary helper ----------------------------------------------------------------------
def test_tiny_vocab_layout(tok: Tokenizer) -> None:
    f = tiny_spm_vocab()
    tokens = f["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list)
    assert 300 <= len(tokens) <= 700
    assert tokens[:6] == ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    assert tokens[7] == "<0x00>" and tokens[7 + 255] == "<0xFF>"
    assert len(set(tokens)) == len(tokens)
    for key in (
        "model",
        "tokens",
        "scores",
        "token_type",
        "bos_token_id",
        "eos_token_id",
        "unknown_token_id",
        "padding_token_id",
        "add_bos_token",
        "add_space_prefix",
    ):
        assert "tokenizer.ggml." + key in f
    assert tok.vocab_size == len(tokens)
    assert tok.spec.eot_ids == (1, 5)
    assert tok.token_to_id("▁the") is not None
    assert tok.token_to_id("no-such-token") is None
    # extra pieces are added, reachable and encodable as one token
    t2 = tokenizer_from_gguf_fields(tiny_spm_vocab(["▁verinfer"]))
    assert t2.vocab_size > tok.vocab_size
    assert t2.encode(" verinfer", add_bos=False) == [t2.token_to_id("▁verinfer")]


# ---- merges ----------------------------------------------------------------------------------
def test_merges_follow_scores() -> None:
    # "abc": ab (score -1) beats bc (score -2) -> [ab, c]
    t = _mini([("a", -10), ("b", -10), ("c", -10), ("ab", -1), ("bc", -2)])
    assert [t.spec.tokens[i] for i in t.encode("abc")] == ["ab", "c"]
    # flip the scores -> [a, bc]
    t = _mini([("a", -10), ("b", -10), ("c", -10), ("ab", -2), ("bc", -1)])
    assert [t.spec.tokens[i] for i in t.encode("abc")] == ["a", "bc"]
    # ties: leftmost pair first
    t = _mini([("a", -10), ("b", -10), ("c", -10), ("ab", -1), ("bc", -1)])
    assert [t.spec.tokens[i] for i in t.encode("abc")] == ["ab", "c"]
    # "aaaa" with only "aa": two tokens, merged left to right
    t = _mini([("a", -10), ("aa", -1)])
    assert [t.spec.tokens[i] for i in t.encode("aaaaa")] == ["aa", "aa", "a"]


def test_merges_need_intermediate_pieces() -> None:
    # "abc" is in the vocabulary but neither "ab" nor "bc" is: BPE cannot reach it
    t = _mini([("a", -10), ("b", -10), ("c", -10), ("abc", 0)])
    assert [t.spec.tokens[i] for i in t.encode("abc")] == ["a", "b", "c"]


def test_english_uses_merges(tok: Tokenizer) -> None:
    ids = tok.encode("Hello the world", add_bos=False)
    pieces = [tok.spec.tokens[i] for i in ids]
    assert "▁the" in pieces and "▁world" in pieces
    assert tok.encode(" the", add_bos=False) == [tok.token_to_id("▁the")]
    assert tok.decode(ids) == "Hello the world"


def test_gemma_variant_uses_position_and_respells_spaces() -> None:
    base = _mini([("a", -10), ("b", -10), ("c", -10), ("ab", -2), ("bc", -1)])
    fields: dict[str, object] = {
        "tokenizer.ggml." + k: v
        for k, v in {
            "model": "llama",
            "tokens": [*base.spec.tokens, "  "],
            "scores": [*(base.spec.scores or ()), -1000.0],
            "token_type": [*(base.spec.token_types or ()), TOKEN_USER_DEFINED],
            "add_bos_token": False,
            "add_space_prefix": False,
            "bos_token_id": 2,
        }.items()
    }
    spm = tokenizer_from_gguf_fields(fields)
    gem = tokenizer_from_gguf_fields({**fields, "general.architecture": "gemma3"})
    assert spm.spec.variant == "spm" and gem.spec.variant == "gemma"
    assert spm.hash != gem.hash
    # spm: score order ("bc" scores higher); gemma: vocabulary order ("ab" comes first)
    assert [spm.spec.tokens[i] for i in spm.encode("abc")] == ["a", "bc"]
    assert [gem.spec.tokens[i] for i in gem.encode("abc")] == ["ab", "c"]
    gem2 = tokenizer_from_gguf_fields({**fields, "general.architecture": "gemma3"}, variant="gemma")
    assert gem2.hash == gem.hash
    sp = len(base.spec.tokens)
    # spm: "  " is a user-defined token matched in the raw text
    assert spm.encode("a  b") == [spm.token_to_id("a"), sp, spm.token_to_id("b")]
    # gemma: looked up as "▁▁" during merging; here "▁" is missing -> bytes, so no merge
    assert sp not in gem.encode("a  b")
    assert gem.decode([sp]) == "  " and spm.decode([sp]) == "  "


# ---- byte fallback / round trips ---------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    ["😀", "你好，世界", "naïve café", "👍🏽 ok", "\u0000\u0001", "a\u00a0b", "𝔘𝔫𝔦", "\r\n\t"],
)
def test_byte_fallback_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text, add_bos=False)
    assert tok.decode(ids) == text
    byte_ids = [i for i in ids if tok.spec.token_types and tok.spec.token_types[i] == TOKEN_BYTE]
    if any(ord(c) > 0x7E for c in text):
        assert byte_ids


def test_byte_fallback_exact_bytes(tok: Tokenizer) -> None:
    ids = tok.encode("😀", add_bos=False)
    assert [tok.spec.tokens[i] for i in ids] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]


def test_unk_without_byte_tokens() -> None:
    fields = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": ["<unk>", "a", "b", "ab"],
        "tokenizer.ggml.scores": [0.0, -5.0, -5.0, -1.0],
        "tokenizer.ggml.token_type": [2, 1, 1, 1],
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_space_prefix": False,
    }
    t = tokenizer_from_gguf_fields(fields)
    assert t.encode("abxab") == [3, 0, 3]
    assert t.decode([3, 0, 3]) == "abab"
    assert t.decode([3, 0, 3], skip_special=False) == "ab<unk>ab"


def test_random_round_trip(tok: Tokenizer) -> None:
    rng = random.Random(1234)
    for _ in range(400):
        s = _random_text(rng, rng.randint(0, 60))
        ids = tok.encode(s, add_bos=False, parse_special=False)
        assert tok.decode(ids, skip_special=False) == s
        # with special parsing, only control tokens are dropped by skip_special
        ids2 = tok.encode(s)
        assert tok.decode(ids2, skip_special=False) == "<bos>" + s
        for name in ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"):
            s = s.replace(name, "")
        assert tok.decode(ids2) == s


def test_add_space_prefix_round_trip() -> None:
    t = _tok(add_space_prefix=True)
    ids = t.encode("the cat", add_bos=False)
    assert ids[0] == t.token_to_id("▁the")
    assert t.decode(ids) == "the cat"
    assert t.encode("<start_of_turn>the", add_bos=False)[1] == t.token_to_id("▁the")
    sd = StreamDecoder(t)
    assert "".join(sd.push(i) for i in ids) + sd.flush() == "the cat"


def test_space_is_metaspace(tok: Tokenizer) -> None:
    assert tok.encode("a b", add_bos=False) == [
        tok.token_to_id("a"),
        tok.token_to_id("▁b"),
    ]
    # a literal "▁" in the text is the same token as a space (SentencePiece semantics)
    assert tok.encode("a▁b", add_bos=False) == tok.encode("a b", add_bos=False)


# ---- special tokens -------------------------------------------------------------------------
def test_special_tokens_parsed(tok: Tokenizer) -> None:
    text = "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    ids = tok.encode(text)
    sot, eot, nl = (tok.token_to_id(s) for s in ("<start_of_turn>", "<end_of_turn>", "\n"))
    assert ids[0] == 2
    assert ids[1] == sot
    assert ids.count(sot) == 2 and ids.count(eot) == 1 and ids.count(nl) == 3
    assert tok.decode(ids, skip_special=False) == "<bos>" + text
    assert tok.decode(ids) == "user\nhi\nmodel\n"


def test_special_tokens_not_parsed(tok: Tokenizer) -> None:
    text = "<start_of_turn>user<bos>"
    ids = tok.encode(text, add_bos=False, parse_special=False)
    control = {i for i, t in enumerate(tok.spec.token_types or ()) if t == TOKEN_CONTROL}
    assert not control & set(ids)
    assert tok.decode(ids) == text
    # user-defined tokens ("\n") are always matched whole
    assert tok.token_to_id("\n") in tok.encode("a\nb", parse_special=False)


def test_longest_special_match() -> None:
    f = tiny_spm_vocab()
    tokens = list(f["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    types = list(f["tokenizer.ggml.token_type"])  # type: ignore[call-overload]
    scores = list(f["tokenizer.ggml.scores"])  # type: ignore[call-overload]
    tokens += ["<a>", "<a><b>"]
    types += [TOKEN_CONTROL, TOKEN_CONTROL]
    scores += [-1000.0, -1000.0]
    t = tokenizer_from_gguf_fields(
        {
            **f,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores,
        }
    )
    n = len(tokens)
    assert t.encode("<a><b><a>", add_bos=False) == [n - 1, n - 2]


def test_bos_eos_flags(tok: Tokenizer) -> None:
    assert tok.encode("hi")[0] == 2
    assert tok.encode("hi", add_bos=False)[0] != 2
    assert tok.encode("", add_bos=True) == [2]
    assert tok.encode("") == [2]
    assert tok.encode("", add_bos=False) == []
    assert tok.encode("hi", add_eos=True)[-1] == 1
    t = _tok(add_eos_token=True)
    assert t.encode("hi")[-1] == 1


# ---- streaming --------------------------------------------------------------------------------
def test_stream_decoder_matches_decode(tok: Tokenizer) -> None:
    rng = random.Random(99)
    for _ in range(200):
        s = _random_text(rng, rng.randint(0, 40))
        ids = tok.encode(s)
        for skip in (True, False):
            sd = StreamDecoder(tok, skip_special=skip)
            chunks = [sd.push(i) for i in ids]
            tail = sd.flush()
            assert "".join(chunks) + tail == tok.decode(ids, skip_special=skip)
            assert tail == ""
            for c in chunks:
                assert "\ufffd" not in c or "\ufffd" in s
                c.encode("utf-8")  # never a lone surrogate / partial character


def test_stream_decoder_holds_partial_characters(tok: Tokenizer) -> None:
    ids = tok.encode("a😀b", add_bos=False)
    sd = StreamDecoder(tok)
    out = [sd.push(i) for i in ids]
    assert out == ["a", "", "", "", "😀", "b"]
    # random byte soup: same text as decode, replacement characters included
    rng = random.Random(7)
    byte_ids = [tok.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    for _ in range(200):
        ids2 = [rng.choice(byte_ids) for _ in range(rng.randint(0, 12))]
        ids2 = [i for i in ids2 if i is not None]
        sd = StreamDecoder(tok)
        got = "".join(sd.push(i) for i in ids2) + sd.flush()
        assert got == tok.decode(ids2)
    sd = StreamDecoder(tok)
    assert sd.push(byte_ids[0xE2] or 0) == ""
    assert sd.flush() == "\ufffd"


# ---- hash ---------------------------------------------------------------------------------------
def test_hash_stable_and_sensitive(tok: Tokenizer) -> None:
    h = tok.hash
    assert isinstance(h, bytes) and len(h) == 32
    assert _tok().hash == h
    f = tiny_spm_vocab()
    scores = list(f["tokenizer.ggml.scores"])  # type: ignore[call-overload]
    scores[400] -= 0.5
    assert _tok(f, scores=scores).hash != h
    tokens = list(f["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    tokens[400] = tokens[400] + "x"
    assert _tok(f, tokens=tokens).hash != h
    types = list(f["tokenizer.ggml.token_type"])  # type: ignore[call-overload]
    types[400] = TOKEN_USER_DEFINED
    assert _tok(f, token_type=types).hash != h
    assert _tok(add_space_prefix=True).hash != h
    assert _tok(add_bos_token=False).hash != h
    assert _tok(eos_token_id=5).hash != h
    # scores are canonicalised to float32: a float64 that rounds to the same float32 is equal
    scores2 = list(f["tokenizer.ggml.scores"])  # type: ignore[call-overload]
    scores2[400] = scores2[400] + 1e-12
    assert _tok(f, scores=scores2).hash == h


def test_hash_stable_across_processes(tok: Tokenizer) -> None:
    code = (
        "from verinfer.engine.tokenizer.load import tokenizer_from_gguf_fields;"
        "from verinfer.engine.tokenizer.spm import tiny_spm_vocab;"
        "print(tokenizer_from_gguf_fields(tiny_spm_vocab()).hash.hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == tok.hash.hex()


# ---- errors ---------------------------------------------------------------------------------
def test_decode_unknown_id_raises(tok: Tokenizer) -> None:
    with pytest.raises(TokenizerError):
        tok.decode([tok.vocab_size])
    with pytest.raises(TokenizerError):
        tok.decode([-1])
    with pytest.raises(TokenizerError):
        StreamDecoder(tok).push(10**9)


@pytest.mark.parametrize(
    "drop", ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores"]
)
def test_missing_required_keys(drop: str) -> None:
    f = tiny_spm_vocab()
    del f[drop]
    with pytest.raises(TokenizerError):
        tokenizer_from_gguf_fields(f)


def test_bad_fields_raise() -> None:
    f = tiny_spm_vocab()
    with pytest.raises(TokenizerError):
        _tok(f, scores=[0.0])
    with pytest.raises(TokenizerError):
        _tok(f, token_type=[1, 2])
    with pytest.raises(TokenizerError):
        _tok(f, bos_token_id=10**6)
    with pytest.raises(TokenizerError):
        _tok(f, model="bert")
    with pytest.raises(TokenizerError):
        _tok(f, tokens=[])
    with pytest.raises(TokenizerError):
        _tok(f, tokens="abc")
    with pytest.raises(TokenizerError):
        tokenizer_from_gguf_fields({})
    with pytest.raises(TokenizerError):
        tokenizer_from_gguf_fields(f, variant="nope")
    with pytest.raises(TokenizerError):
        tok = _tok(f)
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_gguf_file_round_trip(tmp_path: object) -> None:
    gguf = pytest.importorskip("gguf")
    import pathlib

    assert isinstance(tmp_path, pathlib.Path)
    path = tmp_path / "tiny.gguf"
    f = tiny_spm_vocab()
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(f["tokenizer.ggml.tokens"])
    w.add_token_scores(f["tokenizer.ggml.scores"])
    w.add_token_types(f["tokenizer.ggml.token_type"])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fields = read_gguf_tokenizer_fields(path)
    assert fields["general.architecture"] == "gemma3"
    t = tokenizer_from_gguf(path)
    assert t.spec.variant == "gemma"
    ref = tokenizer_from_gguf_fields(f, variant="gemma")
    assert t.hash == ref.hash
    t2 = tokenizer_from_gguf(gguf.GGUFReader(str(path)))
    assert t2.hash == t.hash
    s = "Hello the world, 😀!"
    assert t.encode(s) == tokenizer_from_gguf_fields(f).encode(s)
    with pytest.raises(TokenizerError):
        tokenizer_from_gguf(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(TokenizerError):
        tokenizer_from_gguf(bad)


def test_space_constant() -> None:
    assert SPACE == "\u2581"


def test_from_tokenizer_json(tmp_path: object) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    import pathlib

    assert isinstance(tmp_path, pathlib.Path)
    f = tiny_spm_vocab()
    tokens = list(f["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
    types = list(f["tokenizer.ggml.token_type"])  # type: ignore[call-overload]
    vocab = {t: i for i, t in enumerate(tokens)}
    ours = tokenizer_from_gguf_fields(f)
    merges = []
    for t in tokens[types.index(TOKEN_NORMAL) :]:  # normal tokens are in merge-priority order
        for k in range(len(t) - 1, 0, -1):  # all splits, longer left piece first
            if t[:k] in vocab and t[k:] in vocab:
                merges.append((t[:k], t[k:]))
    model = tokenizers.models.BPE(
        vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True
    )
    backend = tokenizers.Tokenizer(model)
    backend.normalizer = tokenizers.normalizers.Replace(" ", SPACE)
    backend.decoder = tokenizers.decoders.Sequence(
        [
            tokenizers.decoders.Replace(SPACE, " "),
            tokenizers.decoders.ByteFallback(),
            tokenizers.decoders.Fuse(),
        ]
    )
    specials = [t for t, ty in zip(tokens, types, strict=True) if ty == TOKEN_CONTROL]
    backend.add_special_tokens(
        [tokenizers.AddedToken(t, normalized=False, special=True) for t in specials]
    )
    backend.add_tokens([tokenizers.AddedToken("\n", normalized=False, special=False)])
    path = tmp_path / "tokenizer.json"
    backend.save(str(path))
    t = tokenizer_from_tokenizer_json(path)
    assert t.spec.bos_id == 2 and t.spec.eos_id == 1 and t.spec.eot_ids == (1, 5)
    assert len(t.hash) == 32 and t.hash != ours.hash
    assert t.spec.source_sha256 is not None
    rng = random.Random(3)
    for s in ["Hello the world", "<start_of_turn>user\nhi<end_of_turn>\n", "😀 café"] + [
        _random_text(rng, 20) for _ in range(50)
    ]:
        ids = t.encode(s)
        assert ids == ours.encode(s), repr(s)
        assert t.decode(ids) == ours.decode(ids)
        plain = t.encode(s, parse_special=False, add_bos=False)
        assert plain == ours.encode(s, parse_special=False, add_bos=False), repr(s)
    with pytest.raises(TokenizerError):
        tokenizer_from_tokenizer_json(tmp_path / "missing.json")
