"""What a person sees change without a reload: a run page opened while the run waited for a worker
fills in Started and Worker when a worker takes it; the runs list marks a run that ended
succeeded but learnt nothing."""

from __future__ import annotations

import pytest

from webapp.runs.models import Run
from workers.execute import claim

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

WARNING = "reward was 0 at every step (steps 1 to 2): no episode earned any reward."


def test_started_worker_and_the_warnings_mark_appear_live(live_platform, browser, make_run, log_in, tail):
    run = make_run()  # on the trl backend's own queue, which no worker of this test takes: it stays queued
    page = browser.new_page()
    page.set_default_timeout(30_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{run.pk}/")
        page.wait_for_selector("#dash-live.on")
        assert page.text_content("#run-started") == "—" and page.text_content("#run-worker") == "—"

        claim(run.pk, "cpu-worker-7")
        page.wait_for_function("() => document.getElementById('run-worker').textContent === 'cpu-worker-7'")
        started = Run.objects.get(pk=run.pk).started_at
        assert page.text_content("#run-started") == f"{started:%Y-%m-%d %H:%M:%S}"
        assert page.text_content("#run-status") == "running"

        page.goto(live_platform["url"] + "/")  # the runs list
        mark = f"tr[data-run='{run.pk}'] [data-field=warnings]"
        page.wait_for_selector(mark, state="attached")
        assert not page.is_visible(mark)
        Run.objects.get(pk=run.pk).finish(Run.Status.SUCCEEDED, warnings=[WARNING])
        page.wait_for_selector(mark, state="visible")  # the list's poll, every 4 s
        assert page.text_content(mark) == "learnt nothing" and page.get_attribute(mark, "title") == WARNING
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()
        Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(status=Run.Status.CANCELLED)
