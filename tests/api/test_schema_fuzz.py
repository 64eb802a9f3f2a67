"""Fuzz every API operation from its own OpenAPI schema (schemathesis): no input gives a server error.

Bounded: a fixed number of examples per operation, derandomized, no shrinking of passing runs."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings

from webapp.wsgi import application

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)

EXAMPLES_PER_OPERATION = 8


@pytest.fixture
def auth(owner, make_run, project):
    """A token, and rows for the ids the fuzzer tries (1, 2, ...) to land on."""
    from rest_framework.authtoken.models import Token

    make_run(name="fuzzed")
    make_run(name="external", kind="external", status="running", project=project, visibility="team")
    return {"Authorization": f"Token {Token.objects.get_or_create(user=owner)[0].key}"}


@pytest.fixture(autouse=True)
def _in_the_test_transaction(monkeypatch, settings):
    """Call the WSGI app as Django's test client does: the request's end must not close the test's
    database connection (nor its start), and nothing is sent to a worker."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    from webapp.runs.models import Run

    monkeypatch.setattr(Run, "enqueue", lambda self: None)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_no_server_error(case, auth):
    response = case.call(headers=auth)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
