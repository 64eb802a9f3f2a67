"""A fork beside its parent, as a person sees them: the parent's page offers its stored checkpoints
to fork from, the run form opens with the checkpoint as the model, and once the fork is queued its
page names its parent and step, the parent's page lists it, and the compare page draws the fork's
line from the parent's step it started at."""

from __future__ import annotations

import shutil

import pytest

from training.rollouts.tiny import save_tiny_model
from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_fork_is_shown_beside_its_parent(live_platform, browser, make_run, log_in, tail):
    parent = make_run(name="lineage parent", status=Run.Status.SUCCEEDED, steps=4)
    folder = parent.folder()
    Run.objects.filter(pk=parent.pk).update(run_path=str(folder))
    for step in (2, 4):
        save_tiny_model(folder / "checkpoints" / f"checkpoint-{step}", layers=1, hidden_size=16, seed=step)
    SeriesWriter(parent.pk).write(("reward", step, step / 10) for step in range(1, 5))
    page = browser.new_page()
    page.set_default_timeout(60_000)
    child = None
    try:
        log_in(page, live_platform["url"], "owner", "owner-password")
        page.goto(f"{live_platform['url']}/runs/{parent.pk}/")
        assert page.locator("#run-lineage").count() == 0
        assert page.locator("#fork-step option").all_inner_texts() == ["2", "4"]
        page.select_option("#fork-step", "2")
        page.click("#run-fork button[type=submit]")

        page.wait_for_selector("#run-form")
        model = page.locator("#id_model option:checked")
        assert model.inner_text() == f"run {parent.pk}: its checkpoint of step 2 (a fork)"
        assert page.input_value("#id_name") == "lineage parent fork @2"
        page.fill("#id_name", "lineage child")
        page.click("#run-submit")  # checked in the jail like any run, then queued (no worker takes its queue here)

        page.wait_for_selector("#run-lineage")
        child = Run.objects.get(name="lineage child")
        assert page.url.endswith(f"/runs/{child.pk}/")
        assert " ".join(page.inner_text("#run-parent").split()) == (
            f"Forked from run #{parent.pk} lineage parent at step 2 · compare with it.")
        assert "Optimizer state: carried from the checkpoint when training begins" in page.inner_text("#run-fork-note")

        page.click(f"#run-parent a[href='/runs/{parent.pk}/']")
        page.wait_for_selector("#run-children")
        assert page.url.endswith(f"/runs/{parent.pk}/")
        assert page.inner_text("#run-children") == f"Forks of this run: #{child.pk} lineage child (from step 2)"

        SeriesWriter(child.pk).write(("reward", step, 0.5 + step / 10) for step in range(1, 4))
        page.click(f"#run-children a[href='/runs/{child.pk}/']")
        page.click("#run-compare-parent")
        page.wait_for_selector("body[data-compare-rendered='1']")
        assert f"#{child.pk} lineage child is a fork of #{parent.pk} at step 2: drawn from step 2 on" in page.inner_text("#compare-lineage")
        # The lines as the chart draws them: the fork's starts at the parent's step 3, its own step 1.
        lines = page.evaluate("""Object.fromEntries(document.querySelector(".dash-chart[data-key='reward']").data
                                   .map(trace => [trace.name, Array.from(trace.x)]))""")
        assert lines == {f"#{parent.pk} lineage parent": [1, 2, 3, 4],
                         f"#{child.pk} lineage child (from step 2)": [3, 4, 5]}
        page.click("#compare-align")
        page.wait_for_url(lambda url: "align=steps" in url)
        page.wait_for_selector("body[data-compare-rendered='1']")
        lines = page.evaluate("""Object.fromEntries(document.querySelector(".dash-chart[data-key='reward']").data
                                   .map(trace => [trace.name, Array.from(trace.x)]))""")
        assert lines[f"#{child.pk} lineage child"] == [1, 2, 3]
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        raise
    finally:
        page.close()
        if child is not None:
            Run.objects.filter(pk=child.pk, status=Run.Status.QUEUED).update(status=Run.Status.CANCELLED)
        shutil.rmtree(folder, ignore_errors=True)
