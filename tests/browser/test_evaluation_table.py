"""The evaluation table in the browser: two checkpoints of two runs, evaluated by the platform's
worker on the project's dataset, listed one row per (run, checkpoint, data source) on the project's
evaluations page, reached from the team's page; sorting by a column reorders the rows and puts the
sort in the page's address, which a teammate opens to see the same table."""

from __future__ import annotations

import shutil
import time

import pytest

from standins.checkpoints import with_checkpoints
from webapp.checkpoints import logic
from webapp.checkpoints.models import Evaluation
from webapp.registry.models import Backend

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_evaluation_table_lists_checkpoints_of_two_runs(live_platform, browser, make_run, registry, owner, teammate,
                                                            project, log_in, tail, settings):
    settings.PLAYGROUND_QUEUE = ""
    Backend.objects.filter(name="trl").update(queue=live_platform["queue"])
    runs = [with_checkpoints(make_run(name=name, project=project, visibility="team", status="succeeded", steps=4), [2, 4])
            for name in ("lake alpha", "lake beta")]
    try:
        asked = [logic.submit_evaluation(owner, project, logic.EvaluationRequest(
                     run_id=run.pk, step=step, dataset_id=registry["datasets"]["copy"].pk, max_tasks=3))
                 for run, step in ((runs[0], 2), (runs[1], 4))]
        deadline = time.monotonic() + 300
        while not all(e.is_final for e in Evaluation.objects.filter(pk__in=[e.pk for e in asked])):
            assert time.monotonic() < deadline, tail(live_platform["logs"] / "worker.log")
            time.sleep(0.5)
        assert set(Evaluation.objects.values_list("status", flat=True)) == {"succeeded"}, list(Evaluation.objects.values_list("error", flat=True))

        page = browser.new_page()
        page.set_default_timeout(60_000)
        try:
            log_in(page, live_platform["url"], "owner", "owner-password")
            page.goto(f"{live_platform['url']}/teams/{project.team.slug}/")
            page.click("a.project-evaluations")
            page.wait_for_selector("#evaluation-table")
            cells = page.locator("#evaluation-table tbody tr").evaluate_all(
                "rows => rows.map(r => [...r.cells].slice(0, 4).map(c => c.innerText.trim()))")
            assert cells == [[f"lake alpha #{runs[0].pk}", "checkpoint-2", "copy (test)", "copy"],
                             [f"lake beta #{runs[1].pk}", "checkpoint-4", "copy (test)", "copy"]]

            page.click("#evaluation-table th >> text=Run")  # sorted by run already: a second click reverses it
            page.wait_for_url(lambda url: "descending=true" in url)
            names = page.locator("#evaluation-table tbody tr td:first-child").all_inner_texts()
            assert names == [f"lake beta #{runs[1].pk}", f"lake alpha #{runs[0].pk}"]
            shared = page.url
        finally:
            page.close()

        other = browser.new_page()  # the teammate opens the shared address: the same rows, in the same order
        try:
            other.context.clear_cookies()
            log_in(other, live_platform["url"], "teammate", "teammate-password")
            other.goto(shared)
            assert other.locator("#evaluation-table tbody tr td:first-child").all_inner_texts() == names
        finally:
            other.close()
    finally:
        for run in runs:
            shutil.rmtree(run.folder(), ignore_errors=True)
