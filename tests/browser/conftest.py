"""A live platform for the browser: the web server + a Celery worker on the test database, and headless
Chromium (the system's, driven by Playwright) logged in as the owner persona."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from webapp import server

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


QUEUE = f"test-browser-{uuid.uuid4().hex[:8]}"
ROOT = Path(__file__).resolve().parents[2]


def _listening_port(log) -> int | None:
    """The port the web server (started with ``--port 0``) says it listens on, once it does."""
    found = re.search(rb"Uvicorn running on http://127\.0\.0\.1:(\d+)", log.read_bytes()) if log.exists() else None
    return int(found.group(1)) if found else None


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="package")
def live_platform(django_db_setup, django_db_blocker, tmp_path_factory):
    """The base URL of the web server (webapp/server.py), with a worker taking runs of the ``QUEUE`` queue.
    One for all the browser tests: starting one costs a web server's and a worker's imports.

    The server binds a port the kernel picks (``--port 0``) and the fixture reads it from the
    server's log: a port found free here and bound later by the server could be taken in between,
    and the readiness check would then have found someone else's server."""
    from django.conf import settings
    from django.db import connection

    from workers.processes import database_url

    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    logs = tmp_path_factory.mktemp("platform")
    env = {**os.environ, "DATABASE_URL": db_url, "RUN_HEARTBEAT_SECONDS": "1", "RUN_CANCEL_GRACE_SECONDS": "20",
           "PLATFORM_VAR_DIR": str(settings.VAR_DIR), "DJANGO_SETTINGS_MODULE": "webapp.settings",
           "RUN_WARM_PROCESS": "1"}  # its worker starts several runs, answers and evaluations: forked, as in production
    processes = [
        subprocess.Popen(server.command("127.0.0.1", 0, processes=1),  # several: tests/dashboard/test_server_processes.py
                         cwd=settings.BASE_DIR, env=env, stdout=open(logs / "web.log", "wb"), stderr=subprocess.STDOUT),
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", QUEUE, "--concurrency", "1",
                          "-n", f"{QUEUE}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                         cwd=settings.BASE_DIR, env=env, stdout=open(logs / "worker.log", "wb"), stderr=subprocess.STDOUT),
    ]
    try:
        deadline = time.monotonic() + 90  # only a hang guard: it starts in seconds
        while (port := _listening_port(logs / "web.log")) is None:
            if processes[0].poll() is not None or time.monotonic() > deadline:
                pytest.fail("the web server did not start:\n" + (logs / "web.log").read_text()[-3000:])
            time.sleep(0.2)
        yield {"url": f"http://127.0.0.1:{port}", "queue": QUEUE, "logs": logs}
    finally:
        for process in processes:
            _stop(process)


@pytest.fixture(scope="package")
def browser():
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread; the test's own ORM calls are
    # still plain synchronous ones (Playwright's documented setting for Django tests).
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        user_data = tempfile.mkdtemp(prefix="chromium-")
        context = playwright.chromium.launch_persistent_context(
            user_data, executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000},
        )
        yield context
        context.close()
        shutil.rmtree(user_data, ignore_errors=True)
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def log_in():
    """``log_in(page, base_url, username, password)`` through the login form."""
    def log_in(page, base_url: str, username: str, password: str) -> None:
        page.goto(base_url + "/login/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", password)
        page.click("button[type=submit], input[type=submit]")
        page.wait_for_url(lambda url: "/login/" not in url)

    return log_in


@pytest.fixture
def tail():
    """``tail(path)``: the end of a log file, for a failing test's report."""
    return lambda path: path.read_text(errors="replace")[-3000:] if path.exists() else ""


@pytest.fixture
def embedded_platform(request, tmp_path, tail):
    """``manage.py platform`` (SQLite, the file broker and channel layer) on a free port, stopped with
    Ctrl-C after the test; ``@pytest.mark.parametrize("embedded_platform", [[args]], indirect=True)``
    adds arguments (``--no-demo-run``), and ``[{"args": [...], "env": {...}}]`` settings too. Its
    address and login are chosen as the README says ($PLATFORM_PORT, $PLATFORM_DEMO_USERNAME,
    $PLATFORM_DEMO_PASSWORD); ``login`` is the pair."""
    param = getattr(request, "param", [])
    args, settings = (param.get("args", []), param.get("env", {})) if isinstance(param, dict) else (param, {})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    login = ("ada", "not-the-demo-password")
    env.update({"PLATFORM_VAR_DIR": str(tmp_path / "var"), "RUN_HEARTBEAT_SECONDS": "1", "PLATFORM_PORT": str(port),
                "PLATFORM_DEMO_USERNAME": login[0], "PLATFORM_DEMO_PASSWORD": login[1], **settings})
    log = tmp_path / "platform.log"
    # A child inherits an ignored SIGINT (a shell ignores it in the commands it starts in the
    # background), and Python then raises no KeyboardInterrupt in it: Ctrl-C would do nothing. A
    # handled SIGINT here is reset to the default in the child, as in a terminal. Its own session, so
    # that a platform that does not stop is killed with its web server and worker, none left behind.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen([sys.executable, "manage.py", "platform", *args], cwd=ROOT, env=env,
                                   stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    # A hang guard only: it starts in about 20 s, and took 96 s on a machine at load 12 (its web
    # processes each compiled their templates in 10 s), where 90 s failed the test.
    deadline = time.monotonic() + 240
    while b"Platform running at" not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            pytest.fail("the embedded platform did not start:\n" + tail(log))
        time.sleep(0.3)
    while True:  # the command says so once it has started the web server, which then binds the port
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            break
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the embedded platform's web server did not listen:\n" + tail(log))
        time.sleep(0.3)
    yield {"url": f"http://127.0.0.1:{port}", "var": tmp_path / "var", "log": log, "login": login}
    process.send_signal(signal.SIGINT)  # Ctrl-C: the command stops its web server and worker
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("Ctrl-C did not stop the platform within 60 s:\n" + tail(log))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything of it still running
