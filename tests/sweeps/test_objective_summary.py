"""A sweep scores each trial by its objective's last value, or by a summary of its steps: the
highest, the lowest, or the mean of the last N, read from the run's stored series."""

from __future__ import annotations

import math

import pytest

from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Run
from webapp.sweeps import engine
from webapp.sweeps.models import Sweep, Trial

REWARDS = [0.2, 0.9, math.nan, 0.5, 0.4]  # steps 1 to 5; step 3's value was not finite


@pytest.fixture
def queued(monkeypatch):
    """No worker runs here: the test logs the trial's steps and ends its run itself."""
    monkeypatch.setattr(Run, "enqueue", lambda self: None)


@pytest.mark.parametrize("summary, steps, score, label", [
    ("last", 10, 0.4, "reward"),
    ("max", 10, 0.9, "reward (max over steps)"),
    ("min", 10, 0.2, "reward (min over steps)"),
    ("mean_last", 2, 0.45, "reward (mean of the last 2 steps)"),
    ("mean_last", 3, (0.9 + 0.5 + 0.4) / 3, "reward (mean of the last 3 steps)"),  # the three last finite values
])
def test_a_trial_is_scored_by_the_sweeps_summary(make_run, owner, owner_client, queued, summary, steps, score, label):
    sweep = Sweep.objects.create(owner=owner, name="s", base_run=make_run(name="base"), space={"data.train_batch_size": "choice 2"},
                                 sampler="grid", max_trials=1, parallel=1, objective_summary=summary, objective_steps=steps)
    engine.launch(sweep.pk)
    run = sweep.trials.get().run
    assert run.claim("test-worker")
    SeriesWriter(run.pk).write([("reward", step, value) for step, value in enumerate(REWARDS, start=1)])
    run.finish("succeeded", final_metrics={"reward": 0.4}, steps=len(REWARDS))
    trial = Trial.objects.get(run=run)
    assert trial.state == "complete" and trial.value == pytest.approx(score)
    page = owner_client.get(sweep.get_absolute_url()).content.decode()
    assert f"<h2>{label} against each key</h2>" in page and f"{label} = {round(score, 4):g}" in page


def test_a_summary_of_no_finite_steps_scores_nothing(make_run, owner, queued):
    sweep = Sweep.objects.create(owner=owner, name="s", base_run=make_run(name="base"), space={"data.train_batch_size": "choice 2"},
                                 sampler="grid", max_trials=1, parallel=1, objective_summary="max")
    engine.launch(sweep.pk)
    run = sweep.trials.get().run
    assert run.claim("test-worker")
    SeriesWriter(run.pk).write([("reward", 1, math.nan), ("loss", 1, 0.3)])
    run.finish("succeeded", final_metrics={"reward": 0.4}, steps=1)
    assert Trial.objects.get(run=run).state == "failed"  # no score: the sampler learns nothing from it


def test_the_form_and_the_api_take_a_summary_and_refuse_a_bad_n(owner_client, api_client, make_run, owner, queued):
    base = make_run(name="base")
    form = {"base": base.pk, "name": "by max", "space": "data.train_batch_size: choice 2", "sampler": "grid",
            "objective": "reward", "direction": "maximize", "max_trials": 1, "parallel": 1, "seed": 0}
    response = owner_client.post("/sweeps/new/", {**form, "objective_summary": "mean_last", "objective_steps": 0})
    assert response.status_code == 200 and "objective_steps" in response.context["form"].errors
    assert not Sweep.objects.exists()
    response = owner_client.post("/sweeps/new/", {**form, "objective_summary": "mean_last", "objective_steps": 5})
    assert response.status_code == 302
    assert Sweep.objects.values_list("objective_summary", "objective_steps").get() == ("mean_last", 5)

    client = api_client(owner)
    body = {"name": "api", "base_run": base.pk, "space": {"data.train_batch_size": "choice 2"}, "sampler": "grid", "max_trials": 1,
            "parallel": 1, "objective_summary": "median"}
    response = client.post("/api/sweeps/", body, format="json")
    assert response.status_code == 400 and "objective_summary" in response.json()
    response = client.post("/api/sweeps/", {**body, "objective_summary": "max"}, format="json")
    assert response.status_code == 201 and response.json()["objective_summary"] == "max"
    assert response.json()["objective_steps"] == 10  # the default, unused by max
