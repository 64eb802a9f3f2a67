"""`make run`'s platform in a real browser: no PostgreSQL, no Redis (SQLite, the broker and the
channel layer on files), on the port and with the login the README says how to choose
($PLATFORM_PORT, $PLATFORM_DEMO_USERNAME, $PLATFORM_DEMO_PASSWORD). The demo run it queues trains in
its worker while the page's reward chart gains points over the websocket; then the run is cancelled
from the page."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.browser


def test_the_demo_run_goes_live_in_the_browser_and_cancels(embedded_platform, browser, log_in, tail):
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        banner = embedded_platform["log"].read_text()
        assert f"Platform running at {embedded_platform['url']}/" in banner and "login: {} / {}".format(*embedded_platform["login"]) in banner
        log_in(page, embedded_platform["url"], *embedded_platform["login"])
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
