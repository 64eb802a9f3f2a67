"""API fixtures: clients with real tokens, and fast password hashing for per-test personas."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def token_of():
    from rest_framework.authtoken.models import Token

    return lambda user: Token.objects.get_or_create(user=user)[0].key


@pytest.fixture
def api_client(token_of):
    """A DRF client authenticated with ``user``'s API token (None: no credentials)."""
    from rest_framework.test import APIClient

    def make(user):
        client = APIClient()
        if user is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {token_of(user)}")
        return client

    return make


@pytest.fixture
def no_queue(monkeypatch):
    """Runs are created but not sent to a worker."""
    from webapp.runs.models import Run

    monkeypatch.setattr(Run, "enqueue", lambda self: None)


@pytest.fixture
def published(monkeypatch):
    """What would be pushed to live viewers (the dashboard's channel-layer publishing)."""
    from webapp.dashboard import live

    events = []
    monkeypatch.setattr(live, "publish", lambda run_id, event: events.append((run_id, event)))
    return events
