"""Live messages the channel layer loses do not leave holes in the run page's charts: the page sees
a sequence number skipped, reads the missing steps back from the store and draws every step once;
only when that read keeps failing does it say so."""

from __future__ import annotations

import threading
import time

import pytest
from channels.layers import get_channel_layer
from django.db import connection

from webapp.dashboard import live
from webapp.dashboard.series import SeriesWriter

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


class LosingLayer:
    """The platform's channel layer, except that metric messages carrying one of the steps in
    ``lose`` never arrive (as channels-redis drops what overflows a group's capacity). They are
    still numbered: the publisher numbers a message before handing it to the layer."""

    def __init__(self, lose: set[int]) -> None:
        self.layer, self.lose = get_channel_layer(), lose

    async def group_send(self, group: str, message: dict) -> None:
        if message["type"] == "run.metrics" and any(step in self.lose for step, _ in message["steps"]):
            return
        await self.layer.group_send(group, message)


def _log(publisher: live.Publisher, writer: SeriesWriter, step: int, store_after: float = 0.0) -> threading.Timer | None:
    """As a worker's sink does: push the step live, then store it (``store_after`` seconds later: a
    timer to join)."""
    publisher.publish(writer.run_id, {"type": "run.metrics", "steps": [[step, {"reward": step / 100}]]})
    publisher.flush()
    if store_after:
        def store() -> None:
            try:
                writer.write([("reward", step, step / 100)])
            finally:
                connection.close()  # the timer thread's own connection

        timer = threading.Timer(store_after, store)
        timer.start()
        return timer
    writer.write([("reward", step, step / 100)])
    return None


def _open_run_page(browser, live_platform, log_in, run):
    page = browser.new_page()
    page.set_default_timeout(30_000)
    reads = []  # the backfill's reads of the store
    page.on("request", lambda request: reads.append(request.url) if "series.json" in request.url and "after=" in request.url else None)
    log_in(page, live_platform["url"], "owner", "owner-password")
    page.goto(live_platform["url"] + run.get_absolute_url())
    page.wait_for_selector("#dash-live.on")
    # The consumer's one catch-up read of the store (1.5 s after connecting) has run: from here on
    # the only way a lost message's points reach the page is the page's own backfill.
    page.wait_for_timeout(2000)
    return page, reads


def _steps(page) -> list[int]:
    return page.evaluate("() => (dashboardState.series.get('reward') || {x: []}).x")


def test_lost_messages_are_read_back_and_every_step_is_drawn_once(live_platform, browser, make_run, log_in, tail):
    run = make_run()
    writer = SeriesWriter(run.pk)
    publisher = live.Publisher(LosingLayer(lose={4, 5, 6}))
    page, reads = _open_run_page(browser, live_platform, log_in, run)
    try:
        for step in (1, 2, 3):
            _log(publisher, writer, step)
        page.wait_for_function("() => (dashboardState.series.get('reward') || {x: []}).x.length === 3")
        assert not reads  # nothing lost yet: no read-back
        for step in (4, 5, 6):  # stored, but their live messages are lost
            _log(publisher, writer, step)
        # Step 7's message shows the gap; the worker stores it a second later, so the page's first
        # read may find the store short of step 7 and must read again.
        late = _log(publisher, writer, 7, store_after=1.0)
        for step in range(8, 13):  # live messages during the backfill are kept too
            time.sleep(0.1)
            _log(publisher, writer, step)
        late.join()
        page.wait_for_function("() => (dashboardState.series.get('reward') || {x: []}).x.length >= 12")
        page.wait_for_function("() => !dashboardState.gaps.running")
        assert _steps(page) == list(range(1, 13))
        assert page.evaluate("() => dashboardState.series.get('reward').y") == [s / 100 for s in range(1, 13)]
        page.wait_for_function("() => document.getElementById('chart-reward').dataset.points === '12'")
        assert any("after=3" in url for url in reads), reads  # read back from the last step it had in full
        assert page.locator("#dash-gap-notice").is_hidden()
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()


def test_a_backfill_that_keeps_failing_says_so(live_platform, browser, make_run, log_in, tail):
    run = make_run()
    writer = SeriesWriter(run.pk)
    publisher = live.Publisher(LosingLayer(lose={2}))
    page, reads = _open_run_page(browser, live_platform, log_in, run)
    try:
        page.route(lambda url: "series.json" in url and "after=" in url,
                   lambda route: route.fulfill(status=503, body="unavailable"))
        _log(publisher, writer, 1)
        page.wait_for_function("() => (dashboardState.series.get('reward') || {x: []}).x.length === 1")
        assert page.locator("#dash-gap-notice").is_hidden()
        _log(publisher, writer, 2)  # lost
        _log(publisher, writer, 3)
        # The page tries six times over about 20 s before it gives up and says so.
        page.wait_for_selector("#dash-gap-notice:not([hidden])", timeout=40_000)
        assert "did not arrive" in page.inner_text("#dash-gap-notice")
        assert len(reads) == 6 and _steps(page) == [1, 3]
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()
