"""Settings read from the environment: a bad value names its variable."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from webapp.settings import envbool, envdatabase, envint, envredis


def test_envbool_accepts_usual_spellings(monkeypatch):
    for value, expected in (("1", True), ("yes", True), ("off", False), ("False", False)):
        monkeypatch.setenv("DEBUG", value)
        assert envbool("DEBUG", "false") is expected


def test_envbool_rejects_other_values(monkeypatch):
    monkeypatch.setenv("DEBUG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="DEBUG"):
        envbool("DEBUG", "false")


def test_envint_rejects_text(monkeypatch):
    monkeypatch.setenv("RUN_STALE_SECONDS", "soon")
    with pytest.raises(ImproperlyConfigured, match="RUN_STALE_SECONDS"):
        envint("RUN_STALE_SECONDS", "120")


def test_database_url_default_is_sqlite(monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert envdatabase("DATABASE_URL", "sqlite:////tmp/x.sqlite3")["ENGINE"].endswith("sqlite3")


def test_bad_database_url_names_the_variable(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "nosuchdb://host/name")
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        envdatabase("DATABASE_URL", "sqlite:///x")


def test_postgres_url_is_parsed(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    config = envdatabase("DATABASE_URL", "sqlite:///x")
    assert config["ENGINE"] == "django.db.backends.postgresql" and config["NAME"] == "test"


def test_bad_redis_url_names_the_variable(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "http://localhost:6379")
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL"):
        envredis("REDIS_URL")


def test_release_backoff_cap_below_its_start_is_refused():
    """The settings module itself refuses RUN_RELEASE_BACKOFF_MAX_SECONDS < RUN_RELEASE_BACKOFF_SECONDS."""
    import subprocess
    import sys

    env = {"RUN_RELEASE_BACKOFF_SECONDS": "120", "RUN_RELEASE_BACKOFF_MAX_SECONDS": "60", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", "import webapp.settings"], env=env, capture_output=True, text=True,
                            cwd=__import__("django.conf").conf.settings.BASE_DIR)
    assert result.returncode != 0 and "RUN_RELEASE_BACKOFF_MAX_SECONDS must be at least" in result.stderr
