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


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    """Personas are created per test; the production hasher's million rounds would dominate the run time."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
