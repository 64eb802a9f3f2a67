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


def retokenization_drift(tokenizer: Any, messages: list[dict], token_ids: list[int], *, template: bool = True) -> int | None:
    """Where re-rendering a finished conversation stops giving back the token ids that were
    generated (retokenization drift): the first position of ``token_ids`` (the prompt's and the
    response's ids, as trained on) that the rendering's ids differ at, or None where they agree.

    ``messages`` is the whole conversation, the model's last reply included; it is rendered through
    the chat template (``template``; else its contents are joined, as a plain-string prompt is) and
    encoded again. The rendering may go on past the generated ids (a template closes the last turn
    with text the model never wrote), and a last generated end-of-sequence token need not be in it
    (a reply's text does not hold the token that stopped it)."""
    text = render_messages(tokenizer, messages, add_generation_prompt=False) if template else \
        "".join(str(message.get("content", "")) for message in messages)
    again = encode(tokenizer, text)
    compared = list(token_ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    if compared and eos is not None and compared[-1] == eos and len(again) < len(compared):
        compared.pop()
    for position, (generated, rendered) in enumerate(zip(compared, again)):
        if generated != rendered:
            return position
    return None if len(again) >= len(compared) else len(again)
