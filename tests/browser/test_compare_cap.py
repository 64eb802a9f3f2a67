"""The compare page never drops chosen runs silently: past the number one page draws it says how
many it shows of how many, and links to pages of the rest, whose charts draw those runs."""

from __future__ import annotations

import os

import pytest

from webapp.dashboard.series import SeriesWriter

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CAP = 3


@pytest.fixture(scope="module", autouse=True)
def small_compare_cap():
    """The web server of this module draws at most ``CAP`` runs per compare page (instead of 1,000)."""
    previous = os.environ.get("COMPARE_MAX_RUNS")
    os.environ["COMPARE_MAX_RUNS"] = str(CAP)
    yield
    if previous is None:
        os.environ.pop("COMPARE_MAX_RUNS")
    else:
        os.environ["COMPARE_MAX_RUNS"] = previous


def test_compare_past_the_cap_says_so_and_links_to_the_rest(small_compare_cap, live_platform, browser, make_run, log_in):
    runs = [make_run(name=f"cmp-{i}", status="succeeded") for i in range(8)]
    for i, run in enumerate(runs):
        SeriesWriter(run.pk).write(("reward", step, i + step / 100) for step in range(1, 51))
    ids = [run.pk for run in runs]
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(live_platform["url"] + "/dashboard/compare/?runs=" + ",".join(map(str, ids)))
        page.wait_for_selector("body[data-compare-rendered='1']")
        cap = page.locator("#compare-cap")
        assert cap.is_visible()
        assert f"Showing the first {CAP} of the 8 runs chosen" in cap.inner_text()
        assert page.evaluate("compareState.charts[0].runs.map(r => r.id)") == ids[:CAP]
        links = page.locator("#compare-cap a.compare-rest")
        assert links.count() == 2  # runs 4-6 and 7-8
        assert links.nth(1).inner_text() == f"2 more (#{ids[6]} to #{ids[7]})"
        links.nth(0).click()
        page.wait_for_selector("body[data-compare-rendered='1']")
        assert page.evaluate("compareState.charts[0].runs.map(r => r.id)") == ids[CAP:2 * CAP]
        assert page.evaluate("compareState.charts[0].runs[0].y[0]") == pytest.approx(CAP + 0.01)
        assert page.locator("#compare-cap").count() == 0  # this page holds all it was asked for
    finally:
        page.close()
