"""API fixtures: clients with real tokens, and fast password hashing for per-test personas."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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
