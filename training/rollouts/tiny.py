"""A tiny character-level Qwen2 model built in code, so tests, examples and demos need no download.

A character tokenizer keeps the token view readable (one token per character) and makes every
text round-trip exactly, which lets tests assert on exact token ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

PAD_TOKEN = "<pad>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
_SETTINGS_FILE = "tiny_model.json"


def build_char_tokenizer(extra_chars: str = "") -> PreTrainedTokenizerFast:
    """One token per character: printable ASCII, newline and ``extra_chars``, plus ``<pad>``,
    ``</s>`` (EOS) and ``<unk>``.

    ``decode(encode(s)) == s`` for any text over that alphabet; characters outside it are dropped.
    The vocabulary order is fixed, so the same ``extra_chars`` always gives the same ids.

    It is a Qwen2 byte-level BPE with one symbol per character and merges only inside multi-byte
    characters, rather than a WordLevel tokenizer: ``AutoTokenizer`` always rebuilds the
    tokenizer of a ``qwen2`` checkpoint as ``Qwen2Tokenizer`` (byte-level BPE), so only this form
    survives ``save_pretrained``/``from_pretrained`` unchanged.
    """
    byte_symbol = bytes_to_unicode()
    vocab: dict[str, int] = {PAD_TOKEN: 0, EOS_TOKEN: 1, UNK_TOKEN: 2}
    merges: list[tuple[str, str]] = []

    def add(symbol: str) -> None:
        vocab.setdefault(symbol, len(vocab))

    for char in [chr(code) for code in range(32, 127)] + ["\n"] + list(extra_chars):
        symbols = "".join(byte_symbol[b] for b in char.encode("utf-8"))
        for cut in range(1, len(symbols)):  # merge a multi-byte character back into one token
            add(symbols[:cut])
            add(symbols[cut])
            if (symbols[:cut], symbols[cut]) not in merges:
                merges.append((symbols[:cut], symbols[cut]))
        add(symbols)
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast, layers: int = 2, hidden_size: int = 64, seed: int = 0
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM sized for ``tokenizer``; the same seed gives the same weights.

    The global torch RNG is left untouched, so building a model does not change later sampling.
    """
    heads = max(1, hidden_size // 16)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(directory: str | Path, layers: int = 2, hidden_size: int = 64, seed: int = 0) -> Path:
    """Write a tiny model and its tokenizer so ``AutoModelForCausalLM``/``AutoTokenizer.from_pretrained``
    load it like any checkpoint. A directory already holding the same settings is left as it is."""
    path = Path(directory)
    settings = {"layers": layers, "hidden_size": hidden_size, "seed": seed}
    marker = path / _SETTINGS_FILE
    if marker.is_file() and (path / "config.json").is_file():
        try:
            if json.loads(marker.read_text()) == settings:
                return path
        except json.JSONDecodeError:
            pass  # a broken marker: rebuild
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, layers=layers, hidden_size=hidden_size, seed=seed).save_pretrained(path)
    tokenizer.save_pretrained(path)
    marker.write_text(json.dumps(settings))  # written last: its presence means the save finished
    return path
