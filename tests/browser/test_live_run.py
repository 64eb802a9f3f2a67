"""The whole loop in a real browser: log in, create a run from the form, watch the reward chart
gain points while it trains (and the test split's validation chart), open an episode, watch it through a share link without a login,
cancel the run."""

from __future__ import annotations

import time

import pytest

from webapp.dashboard.models import SeriesTail
from webapp.registry.models import Backend
from webapp.runs.models import Run
from webapp.teams.models import ShareLink

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

OVERRIDES = ("trainer.total_training_steps=500\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\n"
             "data.max_response_length=4\n")


def test_create_watch_open_episode_cancel(live_platform, browser, owner, registry, log_in, tail):
    Backend.objects.filter(name="trl").update(queue=live_platform["queue"])
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(live_platform["url"] + "/runs/new/")
        page.select_option("select[name=agent]", str(registry["agents"]["frozenlake"].pk))
        page.select_option("select[name=dataset]", str(registry["datasets"]["frozenlake"].pk))
        page.select_option("select[name=backend]", str(registry["backends"]["trl"].pk))
        page.select_option("select[name=model]", "tiny-char")
        page.fill("textarea[name=overrides]", OVERRIDES)
        page.click("main form button[type=submit]")
        page.wait_for_url("**/runs/*/")
        run = Run.objects.get(owner=owner)

        # Points arrive over the websocket while the run trains: the chart grows without a reload.
        page.wait_for_selector("#dash-live.on")
        page.wait_for_function("() => (dashboardState.series.get('reward') || {x: []}).x.length >= 2", timeout=90_000)
        seen = page.evaluate("() => dashboardState.series.get('reward').x.length")
        page.wait_for_function(f"() => dashboardState.series.get('reward').x.length > {seen}", timeout=60_000)
        # The chart redraws on the next animation frame after the state grows: wait for the drawing.
        page.wait_for_function("() => Number(document.getElementById('chart-reward').dataset.points || 0) >= 2",
                               timeout=10_000)
        assert int(page.get_attribute("#chart-reward", "data-points") or 0) >= 2
        # What Plotly drew reaches the last step it was given (the series' arrays grow in place).
        drawn = page.evaluate("""() => {
            const div = document.getElementById('chart-reward'), points = Number(div.dataset.points);
            return {last: dashboardState.series.get('reward').x[points - 1], range: div._fullLayout.xaxis.range};
        }""")
        assert drawn["range"][1] >= drawn["last"], drawn
        assert page.text_content("#run-status") == "running"
        # The dataset's test split was scored before the first step: its chart, per data source.
        page.wait_for_function("() => Number((document.getElementById('chart-val_') || {dataset: {}}).dataset.points || 0) >= 1",
                               timeout=10_000)
        assert "val/frozenlake/reward" in page.evaluate("() => [...dashboardState.series.keys()]")
        assert page.locator("#chart-val_ .scatterlayer .trace .points path.point").count() >= 1  # one score: a marker

        # An episode: its turns with the model's response and the environment's observation.
        page.click("tr.dash-episode")
        detail = page.text_content("#dash-episode-detail")
        assert "Model response" in detail and "Environment observation" in detail and "Turn 1" in detail

        # A share link's page, opened without a login: the same chart, live over the token's websocket.
        link = ShareLink.objects.create(run=run, created_by=owner)
        browser.clear_cookies()
        shared = browser.new_page()
        try:
            shared.goto(f"{live_platform['url']}/share/{link.token}/")
            shared.wait_for_selector("#dash-live.on")
            seen = shared.evaluate("() => (dashboardState.series.get('reward') || {x: []}).x.length")
            shared.wait_for_function(f"() => (dashboardState.series.get('reward') || {{x: []}}).x.length > {max(seen, 1)}",
                                     timeout=60_000)
        finally:
            shared.close()
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{run.pk}/")

        page.once("dialog", lambda dialog: dialog.accept())  # "Cancel run N?"
        page.click("#run-cancel button")
        page.wait_for_function("() => document.getElementById('run-status').textContent === 'cancelled'", timeout=60_000)
        run.refresh_from_db()
        assert run.status == Run.Status.CANCELLED
        # The worker folds the ended run's metric tail into blocks just after recording its end: let
        # it finish, or the test database is emptied while it writes (a flush refused now and then).
        deadline = time.monotonic() + 30
        while SeriesTail.objects.filter(run_id=run.pk).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        print("worker log:\n" + tail(live_platform["logs"] / "worker.log"))
        raise
    finally:
        page.close()
