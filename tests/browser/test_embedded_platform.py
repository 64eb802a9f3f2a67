"""`make run`'s platform in a real browser: no PostgreSQL, no Redis (SQLite, the broker and the
channel layer on files), on the port and with the login the README says how to choose
($PLATFORM_PORT, $PLATFORM_DEMO_USERNAME, $PLATFORM_DEMO_PASSWORD). The demo run it queues trains in
its worker while the page's reward chart gains points over the websocket; then the run is cancelled
from the page."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
LOGIN = ("ada", "not-the-demo-password")


@pytest.fixture
def embedded_platform(tmp_path, tail):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    env.update({"PLATFORM_VAR_DIR": str(tmp_path / "var"), "RUN_HEARTBEAT_SECONDS": "1", "PLATFORM_PORT": str(port),
                "PLATFORM_DEMO_USERNAME": LOGIN[0], "PLATFORM_DEMO_PASSWORD": LOGIN[1]})
    log = tmp_path / "platform.log"
    # A child inherits an ignored SIGINT (a shell ignores it in the commands it starts in the
    # background), and Python then raises no KeyboardInterrupt in it: Ctrl-C would do nothing. A
    # handled SIGINT here is reset to the default in the child, as in a terminal. Its own session, so
    # that a platform that does not stop is killed with its web server and worker, none left behind.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen([sys.executable, "manage.py", "platform"], cwd=ROOT, env=env,
                                   stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 90
    while b"Platform running at" not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            pytest.fail("the embedded platform did not start:\n" + tail(log))
        time.sleep(0.3)
    yield {"url": f"http://127.0.0.1:{port}", "var": tmp_path / "var", "log": log}
    process.send_signal(signal.SIGINT)  # Ctrl-C: the command stops its web server and worker
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("Ctrl-C did not stop the platform within 60 s:\n" + tail(log))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything of it still running


def test_the_demo_run_goes_live_in_the_browser_and_cancels(embedded_platform, browser, log_in, tail):
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        banner = embedded_platform["log"].read_text()
        assert f"Platform running at {embedded_platform['url']}/" in banner and f"login: {LOGIN[0]} / {LOGIN[1]}" in banner
        log_in(page, embedded_platform["url"], *LOGIN)
        page.goto(embedded_platform["url"] + "/runs/1/")  # the demo run, the first of a new database
        page.wait_for_selector("#dash-live.on")
        # The web process joined the run's group on the shared folder, where the worker publishes.
        assert len(os.listdir(embedded_platform["var"] / "channels" / "groups" / "run-1")) == 1
        page.wait_for_function("() => (dashboardState.series.get('reward') || {x: []}).x.length >= 1", timeout=120_000)
        seen = page.evaluate("() => dashboardState.series.get('reward').x.length")
        page.wait_for_function(f"() => dashboardState.series.get('reward').x.length > {seen}", timeout=60_000)
        assert page.text_content("#run-status") == "running"

        page.once("dialog", lambda dialog: dialog.accept())  # "Cancel run N?"
        page.click("#run-cancel button")
        page.wait_for_function("() => document.getElementById('run-status').textContent === 'cancelled'", timeout=90_000)
    except Exception:
        print("platform log:\n" + tail(embedded_platform["log"]))
        raise
    finally:
        page.close()
