"""Finding 7: password guessing is locked out (django-axes), API tokens expire and end at logout,
and with DEBUG off cookies are Secure and HttpOnly, HSTS and a Content-Security-Policy are sent,
and ``manage.py check --deploy`` is clean with a production-like environment."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.authtoken.models import Token

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def lockout(settings):
    """A small limit, so the replay is short (the default is ``settings.AXES_FAILURE_LIMIT``)."""
    settings.AXES_FAILURE_LIMIT = 3
    return 3


def test_the_login_page_locks_out_after_repeated_wrong_passwords(client, owner, lockout):
    for _ in range(lockout - 1):
        response = client.post("/login/", {"username": "owner", "password": "wrong"})
        assert response.status_code == 200 and "_auth_user_id" not in client.session
    assert client.post("/login/", {"username": "owner", "password": "wrong"}).status_code == 429  # the last one allowed
    # The right password no longer opens the account from this address...
    response = client.post("/login/", {"username": "owner", "password": "owner-password"})
    assert response.status_code == 429 and "_auth_user_id" not in client.session
    # ...while the same user from another address, and other users, still log in.
    other = client_from("10.0.0.7")
    assert other.post("/login/", {"username": "owner", "password": "owner-password"}).status_code == 302


def client_from(address: str):
    from django.test import Client

    return Client(REMOTE_ADDR=address)


def test_the_token_endpoint_shares_the_lockout(owner, lockout):
    from rest_framework.test import APIClient

    client = APIClient()
    for _ in range(lockout - 1):
        assert client.post("/api/token/", {"username": "owner", "password": "wrong"}).status_code == 400
    assert client.post("/api/token/", {"username": "owner", "password": "wrong"}).status_code == 429
    response = client.post("/api/token/", {"username": "owner", "password": "owner-password"})
    assert response.status_code == 429 and "try again" in response.json()["detail"] and response["Retry-After"]
    assert not Token.objects.filter(user=owner).exists()
    # Failures on the API lock the login page too (one count per account and address).
    assert client_from("127.0.0.1").post("/login/", {"username": "owner", "password": "owner-password"}).status_code == 429


def test_a_successful_login_resets_the_count(client, owner, lockout):
    for _ in range(lockout - 1):
        client.post("/login/", {"username": "owner", "password": "wrong"})
    assert client.post("/login/", {"username": "owner", "password": "owner-password"}).status_code == 302
    client.logout()
    for _ in range(lockout - 1):
        client.post("/login/", {"username": "owner", "password": "wrong"})
    assert client.post("/login/", {"username": "owner", "password": "owner-password"}).status_code == 302


def test_api_tokens_expire(owner, api_client):
    client = api_client(owner)
    assert client.get("/api/runs/").status_code == 200
    Token.objects.filter(user=owner).update(created=Token.objects.get(user=owner).created - timedelta(seconds=settings.API_TOKEN_TTL_SECONDS + 1))
    response = client.get("/api/runs/")
    assert response.status_code == 401 and "expired" in response.json()["detail"]
    assert not Token.objects.filter(user=owner).exists()


def test_the_token_endpoint_replaces_an_expired_token(owner):
    from rest_framework.test import APIClient

    first = APIClient().post("/api/token/", {"username": "owner", "password": "owner-password"}).json()
    assert first["token"] and first["expires"]
    Token.objects.filter(user=owner).update(created=Token.objects.get(user=owner).created - timedelta(seconds=settings.API_TOKEN_TTL_SECONDS + 1))
    second = APIClient().post("/api/token/", {"username": "owner", "password": "owner-password"}).json()
    assert second["token"] != first["token"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {second['token']}")
    assert client.get("/api/runs/").status_code == 200


def test_logging_out_ends_the_api_token(client, owner, api_client):
    token_client = api_client(owner)
    assert token_client.get("/api/runs/").status_code == 200
    client.post("/login/", {"username": "owner", "password": "owner-password"})
    assert client.post("/logout/").status_code == 302
    assert token_client.get("/api/runs/").status_code == 401


def test_cookies_are_secure_and_http_only(client, owner):
    assert not settings.DEBUG
    page = client.get("/login/")
    assert page.cookies["csrftoken"]["secure"] and page.cookies["csrftoken"]["httponly"]
    response = client.post("/login/", {"username": "owner", "password": "owner-password"})
    session = response.cookies["sessionid"]
    assert session["secure"] and session["httponly"] and session["samesite"] == "Lax"


def test_hsts_and_a_content_security_policy_are_sent(owner_client):
    response = owner_client.get("/", secure=True)
    assert "max-age=" in response["Strict-Transport-Security"]
    policy = response["Content-Security-Policy"]
    directives = dict((part.split(" ", 1) + [""])[:2] for part in (p.strip() for p in policy.split(";")) if part)
    assert "'unsafe-inline'" not in directives["script-src"] and "'nonce-" in directives["script-src"]
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"


def test_every_inline_script_carries_the_nonce_and_no_inline_handler_is_left(owner_client, make_run):
    """The policy refuses inline scripts without the page's nonce and every ``on...=`` attribute,
    so a template that adds one would break in the browser."""
    run = make_run()
    pages = ["/", f"/runs/{run.pk}/", "/runs/new/", f"/dashboard/compare/?runs={run.pk}", "/teams/"]
    for url in pages:
        response = owner_client.get(url)
        assert response.status_code == 200, url
        nonce = re.search(r"'nonce-([^']+)'", response["Content-Security-Policy"]).group(1)
        html = response.content.decode()
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert "src=" in tag or f'nonce="{nonce}"' in tag or "application/json" in tag, (url, tag)
        assert not re.search(r"\son[a-z]+\s*=", html), (url, re.search(r"\son[a-z]+\s*=[^>]*", html).group(0))
    for folder in ("webapp",):
        for template in (ROOT / folder).rglob("*.html"):
            assert not re.search(r"\son(click|submit|change|load|input)\s*=", template.read_text()), template


def test_check_deploy_is_clean_with_a_production_like_environment():
    env = {
        **os.environ, "DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "platform.example.com",
        "SECURE_SSL_REDIRECT": "1", "DJANGO_SETTINGS_MODULE": "webapp.settings",
    }
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout, result.stdout


@pytest.mark.parametrize("body", [["owner"], "owner", {"username": "o" * 5000, "password": "x"},
                                  {"username": "own\x00er", "password": "x"}, {"username": ["a"], "password": 1}])
def test_odd_token_requests_are_400(body, db):
    from rest_framework.test import APIClient

    assert APIClient().post("/api/token/", body, format="json").status_code == 400
