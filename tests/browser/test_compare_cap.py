"""The compare page never drops chosen runs silently: past the number one page draws
(``COMPARE_MAX_RUNS``, 1,000) it says how many it shows of how many, and links to pages of the
rest, whose charts draw those runs; and every run a page shows is drawn, also when many runs share
a few WebGL traces."""

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


def test_every_run_is_drawn_when_runs_share_webgl_traces(live_platform, browser, make_run, log_in):
    """Past a few dozen runs the page draws one WebGL trace per palette colour, runs separated by
    gaps: every run with a series must still be in the chart, each with all its points, and named
    where the pointer hovers (counted from the chart's own data, not from the page's bookkeeping)."""
    template = make_run(name="many-0", status="succeeded")
    fields = {f.attname: getattr(template, f.attname) for f in Run._meta.concrete_fields if f.attname not in ("id", "uid")}
    Run.objects.bulk_create([Run(**{**fields, "name": f"many-{i}"}) for i in range(1, 121)])
    runs = dict(Run.objects.filter(name__startswith="many-").values_list("pk", "name"))
    with_series = sorted(runs)[:-1]  # the last one has none: it is not drawn
    for i, run_id in enumerate(with_series):
        SeriesWriter(run_id).write(("reward", step, i + step / 100) for step in range(1, 41 + i % 3))
    page = browser.new_page()
    page.set_default_timeout(90_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(live_platform["url"] + "/dashboard/compare/?runs=" + ",".join(map(str, sorted(runs))))
        page.wait_for_selector("body[data-compare-rendered='1']")
        drawn = page.evaluate("""(() => {
            const chart = document.querySelector(".dash-chart[data-key='reward']");
            const points = {};
            for (const trace of chart.data)
                trace.x.forEach((x, i) => { if (x !== null) points[trace.text[i]] = (points[trace.text[i]] || 0) + 1; });
            return {points, types: [...new Set(chart.data.map(t => t.type))], traces: chart.data.length};
        })()""")
        assert drawn["points"] == {f"#{run_id} {runs[run_id]}": 40 + i % 3 for i, run_id in enumerate(with_series)}
        assert drawn["types"] == ["scattergl"] and drawn["traces"] <= 10
    finally:
        page.close()
