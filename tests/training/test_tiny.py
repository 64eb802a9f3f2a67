"""The tiny character-level model: exact round-trips, determinism, and loading through from_pretrained."""

from __future__ import annotations

import os
import string

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.rollouts.tiny import build_char_tokenizer, build_tiny_model, save_tiny_model

TEXT = string.printable[:95] + "\n  two  spaces\n\nand a blank line </ends> here\n"




def test_tokenizer_round_trips_printable_ascii_one_token_per_character():
    tokenizer = build_char_tokenizer()
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(TEXT)
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.decode([tokenizer.convert_tokens_to_ids("A")]) == "A"


def test_tokenizer_has_distinct_pad_and_eos_and_skips_them_when_decoding():
    tokenizer = build_char_tokenizer()
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("<pad>", "</s>")
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    ids = tokenizer("hi", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hi"
    assert tokenizer.decode(ids) == "hi</s><pad>"


def test_tokenizer_vocabulary_is_deterministic_and_takes_extra_characters():
    first, second = build_char_tokenizer(), build_char_tokenizer()
    assert first.get_vocab() == second.get_vocab()
    assert len(first) == 3 + 95 + 1  # specials + printable ASCII + newline
    extended = build_char_tokenizer(extra_chars="é→")
    text = "café → bar"
    ids = extended(text, add_special_tokens=False)["input_ids"]
    assert extended.decode(ids) == text
    assert len(ids) == len(text)
    # Existing ids do not move when characters are added.
    assert extended.convert_tokens_to_ids("A") == first.convert_tokens_to_ids("A")


def test_model_matches_tokenizer_and_seed_fixes_weights():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, layers=1, hidden_size=32, seed=3)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    same = build_tiny_model(tokenizer, layers=1, hidden_size=32, seed=3)
    other = build_tiny_model(tokenizer, layers=1, hidden_size=32, seed=4)
    weights = model.model.embed_tokens.weight
    assert torch.equal(weights, same.model.embed_tokens.weight)
    assert not torch.equal(weights, other.model.embed_tokens.weight)
    logits = model(torch.tensor([[5, 6, 7]])).logits
    assert logits.shape == (1, 3, len(tokenizer))


def test_building_a_model_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(build_char_tokenizer(), layers=1, hidden_size=32)
    assert torch.equal(torch.rand(3), expected)


def test_saved_model_loads_through_auto_classes(tmp_path):
    path = save_tiny_model(tmp_path / "tiny", layers=1, hidden_size=32, seed=1)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == TEXT
    assert ids == build_char_tokenizer()(TEXT, add_special_tokens=False)["input_ids"]
    assert len(tokenizer) == model.config.vocab_size
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1)
    built = build_tiny_model(build_char_tokenizer(), layers=1, hidden_size=32, seed=1)
    sample = torch.tensor([ids[:20]])
    assert torch.allclose(model(sample).logits, built(sample).logits, atol=1e-5)


def test_save_is_idempotent_and_rebuilds_on_new_settings(tmp_path):
    path = save_tiny_model(tmp_path, layers=1, hidden_size=32)
    weights = path / "model.safetensors"
    os.utime(weights, ns=(1, 1))  # a rewrite would give the file a current time
    assert save_tiny_model(tmp_path, layers=1, hidden_size=32) == path
    assert weights.stat().st_mtime_ns == 1
    save_tiny_model(tmp_path, layers=2, hidden_size=32)
    assert weights.stat().st_mtime_ns != 1
    assert AutoModelForCausalLM.from_pretrained(path).config.num_hidden_layers == 2


@pytest.mark.parametrize("hidden_size", [32, 64, 96])
def test_model_sizes_build(hidden_size):
    model = build_tiny_model(build_char_tokenizer(), layers=1, hidden_size=hidden_size)
    assert model.config.hidden_size == hidden_size
    assert model.config.hidden_size % model.config.num_attention_heads == 0
