"""Bring your own, in a real browser against a live platform (web server and worker): upload a CSV
into a project, map its columns, start a run from it that trains on a worker; invite a teammate by
link, who sets a password, logs in and sees the team's run."""

from __future__ import annotations

import pytest

from webapp.registry.models import Backend, Dataset
from webapp.runs.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

CSV = "text,copy,note\n" + "".join(f"ab{i % 10},ab{i % 10},row {i}\n" for i in range(12))
OVERRIDES = "trainer.total_training_steps=2\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\ndata.max_response_length=4\n"


def test_upload_a_csv_start_a_run_from_it_and_invite_a_teammate(live_platform, browser, owner, team, registry, log_in, tail):
    Backend.objects.filter(name="trl").update(queue=live_platform["queue"])
    url = live_platform["url"]
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        log_in(page, url, "owner", "owner-password")
        page.goto(f"{url}/teams/{team.slug}/")
        page.click("a.project-registry")
        page.click("#upload-dataset")
        page.fill("input[name=name]", "my-copies")
        page.set_input_files("input[name=file]", {"name": "copies.csv", "mimeType": "text/csv", "buffer": CSV.encode()})
        page.click("#dataset-upload button[type=submit]")

        # The preview of the first rows, and the mapping to what the agent and reward read.
        page.wait_for_selector("#upload-preview")
        first = page.eval_on_selector_all("#upload-preview tbody tr:first-child td", "cells => cells.map(c => c.textContent)")
        assert first == ["ab0", "ab0", "row 0"]
        page.select_option("select[name=prompt]", "text")
        page.select_option("select[name=ground_truth]", "copy")
        page.fill("input[name=test_percent]", "25")
        page.click("#dataset-map button[type=submit]")

        # The run form opens with the dataset and the project chosen.
        page.wait_for_url("**/runs/new/?*")
        dataset = Dataset.objects.get(name="my-copies")
        assert page.eval_on_selector("select[name=dataset]", "s => s.value") == str(dataset.pk)
        page.select_option("select[name=agent]", str(registry["agents"]["copy-task"].pk))
        page.select_option("select[name=reward]", str(registry["rewards"]["char-accuracy"].pk))
        page.select_option("select[name=backend]", str(registry["backends"]["trl"].pk))
        page.select_option("select[name=model]", "tiny-char")
        page.fill("textarea[name=overrides]", OVERRIDES)
        page.click("#run-form button[type=submit]")
        page.wait_for_url("**/runs/*/")
        run = Run.objects.get(dataset=dataset)
        page.wait_for_function("() => ['succeeded', 'failed'].includes(document.getElementById('run-status').textContent)",
                               timeout=180_000)
        run.refresh_from_db()
        assert (run.status, run.steps, run.error) == (Run.Status.SUCCEEDED, 2, "")
        assert run.project == team.project and run.visibility == Run.Visibility.TEAM

        # An invitation link from the team page; the invitee sets a password and is in.
        page.goto(f"{url}/teams/{team.slug}/")
        page.click("#invitation-create button[type=submit]")
        link = page.input_value("#invitation-link input")
        browser.clear_cookies()
        page.goto(link)
        page.fill("input[name=username]", "new-teammate")
        page.fill("input[name=password1]", "a long passphrase")
        page.fill("input[name=password2]", "a long passphrase")
        page.click("#invitation-accept button[type=submit]")
        page.wait_for_url(f"**/teams/{team.slug}/")
        assert "new-teammate" in page.text_content("#team-members")

        browser.clear_cookies()
        log_in(page, url, "new-teammate", "a long passphrase")
        page.goto(f"{url}/runs/{run.pk}/")  # the team's run, seen by the new member
        assert page.text_content("#run-status") == "succeeded"
    except Exception:
        print("web log:\n" + tail(live_platform["logs"] / "web.log"))
        print("worker log:\n" + tail(live_platform["logs"] / "worker.log"))
        raise
    finally:
        page.close()
