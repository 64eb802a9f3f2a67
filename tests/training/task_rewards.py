"""The tiny task the backends' training tests share, importable without pytest (the swift
backend's environment loads the reward from this file)."""

PROMPTS = [{"prompt": p} for p in ("x=", "y=", "z=", "w=")]


def starts_with_a(task, response):
    return 1.0 if response.startswith("a") else 0.0


def starts_a_to_m(task, response):
    """1 when the response starts with one of a-m: about one random sample in eight earns it, so
    even the untrained tiny model's first batch has a signal to learn from."""
    return 1.0 if response[:1] and "a" <= response[0] <= "m" else 0.0
