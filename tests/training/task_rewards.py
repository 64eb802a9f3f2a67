"""The tiny task the backends' training tests share, importable without pytest (the swift
backend's environment loads the reward from this file)."""

PROMPTS = [{"prompt": p} for p in ("x=", "y=", "z=", "w=")]


def starts_with_a(task, response):
    return 1.0 if response.startswith("a") else 0.0
