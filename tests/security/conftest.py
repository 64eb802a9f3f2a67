"""Security fixtures: fast password hashing for per-test personas, and a watch on the queue."""

from __future__ import annotations

from unittest import mock

import pytest


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def apply_async():
    """The Celery send of a run (by name), kept from a broker (a refused run is never created: the tests count Run rows)."""
    with mock.patch("webapp.celery_app.app.send_task") as patched:
        patched.return_value.id = "task-1"
        yield patched
