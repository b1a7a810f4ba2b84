"""Tokenizers: one interface (:class:`Tokenizer`), several implementations.

* :mod:`.spec` -- :class:`TokenizerSpec` from GGUF metadata and its canonical, hashed form;
* :mod:`.base` -- the :class:`Tokenizer` interface with the shared identity/decoding code;
* :mod:`.spm` -- pure-Python SentencePiece BPE (Gemma, Llama 2) and the tiny test vocabulary;
* :mod:`.bytelevel` -- byte-level BPE (``gpt2``: SmolLM, Llama 3, Qwen ...) and HF
  ``tokenizer.json`` models, delegated to the maintained ``tokenizers`` library;
* :mod:`.stream` -- the incremental detokenizer.
"""
