"""Secrets at rest (tracking API keys, webhook URLs with tokens): Fernet, keyed from SECRET_KEY.

A database dump or a backup holds only ciphertext; the web pages never show a secret back, only
whether one is set.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    key = hashlib.sha256(b"integrations-secrets:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def seal(plain: str) -> str:
    return _fernet().encrypt(plain.encode()).decode() if plain else ""


def unseal(sealed: str) -> str:
    if not sealed:
        return ""
    try:
        return _fernet().decrypt(sealed.encode()).decode()
    except InvalidToken as exc:  # SECRET_KEY changed since it was stored
        raise ValueError("a stored secret cannot be read (SECRET_KEY changed?); set it again") from exc
