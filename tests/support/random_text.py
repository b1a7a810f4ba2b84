"""Seeded random text for tokenizer equality tests: the input classes where two tokenizers are
most likely to part ways, mixed at random into short strings.

Classes: ASCII words and punctuation, whitespace runs (spaces, tabs, newlines, CR, NBSP and
other Unicode spaces), C0/C1 control characters, combining marks (alone and stacked), emoji
(skin tones, ZWJ families, flags, variation selectors), CJK/Arabic/Cyrillic/Devanagari/Thai,
characters most vocabularies lack (private use, astral math, unassigned-looking code points:
byte fallback), the metaspace ``"▁"``, and special-token-like text: real special tokens of the
vocabulary under test, their prefixes, ``<0xNN>`` spellings and HTML fragments.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
          "Paris", "café", "naïve", "résumé", "import", "def", "return", "None", "1234",
          "3.14", "-42", "1e-9", "http://x.y/z?a=1&b=2", "foo_bar", "fooBar"]
_PUNCT = list(".,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~`")
_SPACES = [" ", "  ", "   ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r",
           " \n ", "\u00a0", "\u2003", "\u3000", "\u200b", "\ufeff", " " * 17]
_CONTROLS = [chr(c) for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))]
_COMBINING = [chr(c) for c in range(0x0300, 0x0370)] + ["\u20dd", "\u0e31", "\u093f"]
_EMOJI = ["😀", "👍🏽", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "❤️", "✌🏿", "🧑‍💻", "🏳️‍🌈", "#️⃣", "🎉", "\U0001faf6"]
_SCRIPTS = ["東京", "你好世界", "ひらがな", "カタカナ", "서울", "Москва", "القاهرة", "हिन्दी",
            "ภาษาไทย", "Ελληνικά", "עברית", "ქართული", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
_RARE = ["\ue000", "\uf8ff", "\U000f0000", "\U0010fffd", "\U0001d400", "\U0002a6d6", "\u0378",
         "\U000e0001", "\ufffd", "\ufffe", "\U0001f9ff", "\u2fff"]
_SPECIALISH = ["▁", "▁▁", "▁▁▁▁", " ▁", "<0x41>", "<0xE4>", "<0x", "<unk>", "<s>", "</s>",
               "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>",
               "<start_of_turn", "end_of_turn>", "<bos>", "<eos>", "<pad>", "<mask>",
               "[multimodal]", "> </", "><", "</div>", "<br/>", "<unused0>", "<unused99>",
               "{{", "}}", "{%"]


def random_texts(n: int, seed: int, *, specials: Sequence[str] = (),
                 max_chunks: int = 8) -> Iterator[str]:
    """``n`` seeded strings, each 0..``max_chunks`` chunks drawn from the classes above
    (``specials``: the vocabulary's own special-token texts, drawn like the built-in ones)."""
    rng = random.Random(seed)
    specialish = list(_SPECIALISH) + list(specials)

    def chunk() -> str:
        kind = rng.randrange(10)
        if kind == 0:
            return rng.choice(_WORDS) + rng.choice(_PUNCT)
        if kind == 1:
            return rng.choice(_SPACES) * rng.randint(1, 3)
        if kind == 2:
            return "".join(rng.choice(_CONTROLS) for _ in range(rng.randint(1, 3)))
        if kind == 3:
            base = rng.choice("aeoxz ▁" + "東")
            return base + "".join(rng.choice(_COMBINING) for _ in range(rng.randint(1, 4)))
        if kind == 4:
            return "".join(rng.choice(_EMOJI) for _ in range(rng.randint(1, 3)))
        if kind == 5:
            s = rng.choice(_SCRIPTS)
            return s[: rng.randint(1, len(s))]
        if kind == 6:
            return "".join(rng.choice(_RARE) for _ in range(rng.randint(1, 2)))
        if kind == 7:
            s = rng.choice(specialish)
            return s if rng.random() < 0.7 else s[: rng.randint(0, len(s))]
        if kind == 8:
            return "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(1, 12)))
        return chr(rng.randint(0x00A0, 0x2FFF))  # anywhere in the BMP's alphabets and symbols

    for _ in range(n):
        yield "".join(chunk() for _ in range(rng.randint(0, max_chunks)))
