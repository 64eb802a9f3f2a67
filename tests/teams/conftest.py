"""Teams fixtures: every persona by name, runs of each sharing kind, API clients with real tokens."""

from __future__ import annotations

import pytest

@pytest.fixture
def people(owner, teammate, viewer, stranger, admin_user):
    return {"owner": owner, "teammate": teammate, "viewer": viewer, "stranger": stranger, "anonymous": None, "admin": admin_user}


@pytest.fixture
def shared_run(make_run, project):
    """``shared_run("team")``: a queued run of ``owner`` shared that way."""
    def make(obj: str):
        if obj == "personal":
            return make_run(name=f"{obj} run")
        visibility = "team" if obj == "team" else "private"
        return make_run(name=f"{obj} run", project=project, visibility=visibility)

    return make


@pytest.fixture
def page_client():
    """A Django test client logged in as ``user`` (None: anonymous)."""
    from django.test import Client

    def make(user, **kwargs):
        client = Client(**kwargs)
        if user is not None:
            client.force_login(user)
        return client

    return make


@pytest.fixture
def api_client():
    """A DRF client authenticated with ``user``'s API token (None: no credentials)."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    def make(user):
        client = APIClient()
        if user is not None:
            token, _ = Token.objects.get_or_create(user=user)
            client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client

    return make


@pytest.fixture
def ws_connect():
    """Open the run websocket as ``user`` (None: anonymous), session cookie and all, through the
    same middleware stack as ``webapp.asgi``. Returns (communicator, connected)."""
    from channels.auth import AuthMiddlewareStack
    from channels.db import database_sync_to_async
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from webapp.dashboard.routing import websocket_urlpatterns

    application = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))

    async def connect(user, run_id: int):
        headers = []
        if user is not None:
            client = Client()
            await database_sync_to_async(client.force_login)(user)
            headers = [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        return communicator, connected

    return connect


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    """Personas are created per test; the production hasher's million rounds would dominate the run time."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
