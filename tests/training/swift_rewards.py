"""Rewards for the swift backend's test, in a module the swift environment can import (no pytest)."""


def starts_with_a(task, response):
    return 1.0 if response.startswith("a") else 0.0
