"""A newcomer's walk in a real browser: every page reads as text (no template syntax leaks), fits a
390 px phone without sideways scrolling, a wrong URL gets our own 404 page, /api/docs/ renders its
operations with the network outside the platform blocked, and the destructive buttons ask first.

One live platform and one browser for the whole module (tests/browser/conftest.py)."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from webapp.dashboard.series import SeriesWriter
from webapp.teams.models import ShareLink

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
TEMPLATE_SYNTAX = ("{#", "#}", "{{", "}}", "{%", "%}")


def _pages(run, team, share) -> list[str]:
    return [
        "/", "/runs/new/", f"/runs/{run.pk}/", "/teams/", f"/teams/{team.slug}/", "/fleet/", "/admin/",
        f"/dashboard/compare/?runs={run.pk}", f"/share/{share.token}/", "/no/such/page/",
    ]


@pytest.fixture
def walk(live_platform, browser, admin_user, team, make_run, log_in):
    """An admin (as `make run`'s demo login is) with a team, a run with a short reward series, a share link."""
    from webapp.teams.models import Membership

    Membership.objects.create(team=team, user=admin_user, role=Membership.Role.OWNER)
    run = make_run(owner=admin_user, name="walk")
    SeriesWriter(run.pk).write(("reward", step, step / 10) for step in range(10))
    share = ShareLink.objects.create(run=run, created_by=admin_user)
    page = browser.new_page()
    page.set_default_timeout(30_000)
    log_in(page, live_platform["url"], "admin", "admin-password")
    yield {"page": page, "url": live_platform["url"], "run": run, "paths": _pages(run, team, share)}
    page.close()


def test_every_page_reads_as_text_and_fits_a_phone(walk):
    page, url = walk["page"], walk["url"]
    for width in (1400, PHONE["width"]):
        page.set_viewport_size({"width": width, "height": PHONE["height"]})
        for path in walk["paths"]:
            page.goto(url + path)
            page.wait_for_load_state("load")
            text = page.inner_text("body")
            assert not [s for s in TEMPLATE_SYNTAX if s in text], f"{path} shows template syntax: {text[:500]}"
            if width == PHONE["width"]:
                overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, f"{path} scrolls sideways by {overflow}px at {width}px"


def test_a_wrong_url_gets_our_404_page_not_the_debug_page(walk):
    page = walk["page"]
    response = page.goto(walk["url"] + "/no/such/page/")
    assert response.status == 404
    text = page.inner_text("body")
    assert "Nothing here" in text and "URLconf" not in text and "Your runs" in text
    icon = page.goto(walk["url"] + "/favicon.ico")
    assert icon.status == 200 and "svg" in icon.headers["content-type"]


def test_api_docs_render_with_the_network_blocked(walk):
    page, url = walk["page"], walk["url"]
    platform = urlparse(url).netloc
    outside = []

    def only_the_platform(route):
        if urlparse(route.request.url).netloc == platform:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_platform)
    try:
        page.goto(url + "/api/docs/")
        page.wait_for_selector(".opblock", timeout=20_000)
        assert page.locator(".opblock").count() > 10 and outside == []
        assert "/api/runs/" in page.inner_text("body")
    finally:
        page.unroute("**/*")


def test_cancel_asks_first_and_a_no_keeps_the_run(walk):
    page, run = walk["page"], walk["run"]
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{walk['url']}/runs/{run.pk}/")
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click("#run-cancel button")
    page.wait_for_timeout(300)
    run.refresh_from_db()
    assert asked and "Cancel run" in asked[0] and run.status == run.Status.QUEUED

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#run-cancel button")
    page.wait_for_load_state("load")
    run.refresh_from_db()
    assert run.status == run.Status.CANCELLED


def test_a_finished_run_says_finished_with_a_full_bar(walk, make_run):
    page = walk["page"]
    run = make_run(status="succeeded", steps=2, name="done")
    SeriesWriter(run.pk).write(("reward", step, step / 2) for step in (1, 2))
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{walk['url']}/runs/{run.pk}/")
    page.wait_for_function("() => document.getElementById('dash-live').textContent.includes('finished')")
    assert page.evaluate("() => [document.getElementById('run-bar').value, document.getElementById('run-bar').max]") == [2, 2]
    assert "Step 2 of 2" in page.inner_text("#run-progress")
    assert page.locator("#chart-reward").count() == 1
