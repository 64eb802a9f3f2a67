"""A run that trained but learnt nothing ends succeeded with a warning naming the likely cause,
stored by the worker and shown on the run page, in the runs list and in the API; a run whose
reward moved shows none."""

import html
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from webapp.registry.models import Dataset, RewardFunction
from webapp.runs.models import Run, RunLog
from workers.execute import claim, train_run
from workers.lifecycle import record_end

CSV = "question,answer\n" + "".join(f"say {w},{w}\n" for w in ("ab", "cd", "ef", "gh", "ij", "kl"))
TINY = {"trainer.total_training_steps": 2, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
        "data.max_response_length": 4}


def upload_csv(client, project) -> Dataset:
    """The member's upload, its answer column mapped as the ground truth (data.answer_key=answer)."""
    response = client.post(reverse("registry:dataset_upload", args=[project.pk]),
                           {"name": "sayings", "description": "", "file": SimpleUploadedFile("sayings.csv", CSV.encode())})
    assert response.status_code == 302, response.content.decode()[-2000:]
    mapped = client.post(response["Location"], {"prompt": "question", "ground_truth": "answer", "test_percent": 0})
    assert mapped.status_code == 302, mapped.content.decode()[-2000:]
    return Dataset.objects.get(name="sayings")


def text(response) -> str:
    return html.unescape(response.content.decode())


def warnings_mark(client, run) -> tuple[str, str]:
    """The runs list's warnings mark of ``run``: its tag's attributes and its text."""
    listed = text(client.get(reverse("runs:list")))
    row = listed[listed.index(f'data-run="{run.pk}"'):]
    return re.search(r'<span ([^>]*data-field="warnings"[^>]*)>(.*?)</span>', row[:row.index("</tr>")], re.S).groups()


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_a_reward_reading_a_column_the_upload_lacks_succeeds_with_the_warning_everywhere(
        owner_client, owner, project, make_run, api_client, settings, tmp_path):
    settings.MEDIA_ROOT, settings.RUNS_DIR = tmp_path / "uploads", tmp_path / "runs"
    dataset = upload_csv(owner_client, project)
    # The administrator offers rLLM's F1 reward, which reads task["ground_truth"]: the upload's is 'answer'.
    f1 = RewardFunction.objects.create(name="f1", path="f1")
    # Made as the form makes it (the form's check runs in the jail, tested in test_run_create.py).
    run = make_run(dataset=dataset, reward=f1, project=project, config_overrides=TINY)
    claim(run.pk, "test-worker")

    assert train_run(run.pk) == Run.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.error == "" and run.steps == 2
    [warning] = run.warnings
    assert warning.startswith("reward was 0 at every step (steps 1 to 2)")
    assert "reward function f1 looked for column(s) 'ground_truth', which train_dataset does not have (its columns: question, answer)" in warning
    assert "Have the reward read task['answer'], or rename the column 'answer' to 'ground_truth'." in warning
    assert RunLog.objects.filter(run=run, level="WARNING", message=warning).exists()  # in the run's log too

    page = owner_client.get(run.get_absolute_url())
    assert 'id="run-warnings"' in page.content.decode() and warning in text(page)
    assert 'id="run-warnings-badge"' in page.content.decode()
    attributes, shown = warnings_mark(owner_client, run)
    assert shown == "learnt nothing" and f'title="{warning}"' in attributes and "display:none" not in attributes
    live = owner_client.get(reverse("runs:list_live") + f"?ids={run.pk}").json()
    assert live["runs"][str(run.pk)] == {"status": "succeeded", "steps": 2, "warnings": [warning], "waiting": ""}
    shown = api_client(owner).get(f"/api/runs/{run.pk}/").json()
    assert shown["status"] == "succeeded" and shown["warnings"] == [warning]


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_a_run_whose_reward_moved_shows_no_warning(owner_client, owner, make_run, api_client, settings, tmp_path):
    settings.RUNS_DIR = tmp_path
    # The copy task, scored by char-accuracy: the untrained tiny model matches a character now and then.
    run = make_run(config_overrides={**TINY, "trainer.total_training_steps": 3, "data.train_batch_size": 4,
                                     "actor_rollout_ref.rollout.n": 8})
    claim(run.pk, "test-worker")

    assert train_run(run.pk) == Run.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.warnings == []
    from webapp.dashboard.series import points_after

    spreads = [value for _, value in points_after(run.pk, -1)["reward_std"]]
    assert any(spread > 0 for spread in spreads)  # its episodes' rewards differed: something to learn from
    page = owner_client.get(run.get_absolute_url()).content.decode()
    assert 'id="run-warnings"' not in page and 'id="run-warnings-badge"' not in page
    attributes, shown = warnings_mark(owner_client, run)
    assert shown == "" and "display:none" in attributes
    assert api_client(owner).get(f"/api/runs/{run.pk}/").json()["warnings"] == []


def test_only_a_success_keeps_warnings(make_run):
    for cancelled, status in ((True, Run.Status.CANCELLED), (False, Run.Status.SUCCEEDED)):
        run = make_run()
        claim(run.pk, "w")
        if cancelled:
            run.request_cancel()
        assert record_end(Run.objects.get(pk=run.pk), cancelled, 2, {}, "", ["reward was 0 at every step"]) == status
        assert Run.objects.get(pk=run.pk).warnings == ([] if cancelled else ["reward was 0 at every step"])
