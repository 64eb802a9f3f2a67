"""Chat messages as the text a model reads (its tokenizer's chat template), and that text as token ids."""

from __future__ import annotations

from typing import Any


def render_messages(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Chat messages as the prompt text the model reads.

    With a chat template, the template decides. Without one (the tiny character-level model),
    the contents are simply concatenated, so the model sees exactly the observation text.
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return "".join(str(message.get("content", "")) for message in messages)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of rendered text. No special tokens are added: a chat template writes its own."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
