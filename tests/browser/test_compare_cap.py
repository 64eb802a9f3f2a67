"""The compare page never drops chosen runs silently: past the number one page draws
(``COMPARE_MAX_RUNS``, 1,000) it says how many it shows of how many, and links to pages of the
rest, whose charts draw those runs."""

from __future__ import annotations

import pytest
from django.conf import settings

from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_compare_past_the_cap_says_so_and_links_to_the_rest(live_platform, browser, make_run, log_in):
    cap = settings.COMPARE_MAX_RUNS
    template = make_run(name="cmp-0", status="succeeded")
    fields = {f.attname: getattr(template, f.attname) for f in Run._meta.concrete_fields if f.attname not in ("id", "uid")}
    Run.objects.bulk_create([Run(**{**fields, "name": f"cmp-{i}"}) for i in range(1, cap + 3)])
    ids = sorted(Run.objects.filter(name__startswith="cmp-").values_list("pk", flat=True))
    assert len(ids) == cap + 3
    for run_id in ids[:2] + ids[cap:]:  # a few of them have a reward series
        SeriesWriter(run_id).write(("reward", step, run_id + step / 100) for step in range(1, 51))
    page = browser.new_page()
    page.set_default_timeout(90_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(live_platform["url"] + "/dashboard/compare/?runs=" + ",".join(map(str, ids)))
        page.wait_for_selector("body[data-compare-rendered='1']")
        note = page.locator("#compare-cap")
        assert note.is_visible()
        assert f"Showing the first {cap} of the {cap + 3} runs chosen" in note.inner_text()
        assert page.evaluate("compareState.charts[0].runs.length") == cap
        links = page.locator("#compare-cap a.compare-rest")
        assert links.count() == 1 and links.first.inner_text() == f"3 more (#{ids[cap]} to #{ids[-1]})"
        links.first.click()
        page.wait_for_selector("body[data-compare-rendered='1']")
        assert page.evaluate("compareState.charts[0].runs.map(r => r.id)") == ids[cap:]
        assert page.evaluate("compareState.charts[0].runs[0].y[0]") == pytest.approx(ids[cap] + 0.01)
        assert page.locator("#compare-cap").count() == 0  # this page holds all it was asked for
    finally:
        page.close()
