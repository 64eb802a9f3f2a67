"""The platform's processes never run as root (webapp/privileges.py): started as root, the web
server, a worker and ``manage.py platform`` become an unprivileged user, or refuse to start.

The suite itself runs as root on CI and lets its servers stay root (PLATFORM_ALLOW_ROOT, set in
tests/conftest.py); here it is unset, as on any real machine."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="what happens when started as root")


def as_root_without_a_user(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PLATFORM_ALLOW_ROOT"}
    env.update(PLATFORM_USER="no-such-platform-user", PLATFORM_VAR_DIR=str(tmp_path / "var"), PYTHONPATH=str(ROOT))
    return env


@pytest.mark.parametrize("command", [
    [sys.executable, "-m", "webapp.server", "--port", "0", "--no-warm-checker"],
    [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "refused-queue", "--concurrency", "1", "--pool", "solo"],
    [sys.executable, "manage.py", "platform", "--port", "0", "--no-demo-run"],
])
def test_started_as_root_with_no_user_to_become_it_refuses(tmp_path, command):
    done = subprocess.run(command, cwd=ROOT, env=as_root_without_a_user(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "does not run as root" in done.stdout + done.stderr and "no-such-platform-user" in done.stdout + done.stderr, \
        (done.stdout + done.stderr)[-2000:]
    assert not (tmp_path / "var" / "platform.sqlite3").exists()  # refused before it wrote anything


def test_started_as_root_it_becomes_the_platform_user_and_owns_its_folder(tmp_path):
    """In a child (the change of user is for good): root-owned files in VAR_DIR are handed over."""
    var = tmp_path / "var"
    (var / "runs").mkdir(parents=True)
    (var / "secret_key").write_text("k")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.environ.pop("PLATFORM_ALLOW_ROOT", None)
            os.environ["PLATFORM_USER"] = "nobody"
            from webapp.privileges import drop_root

            drop_root(var)
            found = {"uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups()}
            try:
                os.setuid(0)
                found["regained"] = True
            except PermissionError:
                found["regained"] = False
            os.write(write, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    found = json.loads(os.read(read, 65536))
    nobody = pwd.getpwnam("nobody").pw_uid
    assert found["uid"] == found["euid"] == nobody and found["groups"] == [] and not found["regained"], found
    assert {p.stat().st_uid for p in [var, *var.rglob("*")]} == {nobody}
