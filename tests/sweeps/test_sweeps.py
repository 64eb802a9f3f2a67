"""Sweeps on the platform: trials are ordinary runs, Optuna picks the points and prunes; the
browser form, the API and the results page."""

from __future__ import annotations

import json
import re

import pytest

from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import Run
from webapp.sweeps import engine
from webapp.sweeps.models import Sweep, Trial

SPACE = "actor_rollout_ref.actor.optim.lr: choice 0.01, 0.001, 0.0001\ndata.train_batch_size: choice 2"


@pytest.fixture
def queued(monkeypatch):
    """The runs the sweep sends to the workers' queue (no worker runs here: these tests drive the runs' ends)."""
    sent: list[int] = []
    monkeypatch.setattr(Run, "enqueue", lambda self: sent.append(self.pk))
    return sent


def end(run: Run, status: str, reward: float | None = None) -> None:
    assert run.claim("test-worker")
    run.finish(status, final_metrics={"reward": reward} if reward is not None else {}, steps=2)


@pytest.mark.real_check
def test_a_grid_sweep_from_the_browser_runs_every_point_k_at_a_time(owner_client, make_run, queued,
                                                                     django_capture_on_commit_callbacks):
    base = make_run(name="base")
    response = owner_client.post("/sweeps/new/", {
        "base": base.pk, "name": "lr grid", "space": SPACE, "sampler": "grid", "objective": "reward",
        "direction": "maximize", "max_trials": 10, "parallel": 2, "prune": "on", "seed": 0,
    })
    sweep = Sweep.objects.get()
    assert response.status_code == 302 and response.url == f"/sweeps/{sweep.pk}/"
    trials = list(sweep.trials.select_related("run"))
    assert len(trials) == 2 and len(queued) == 2  # K=2 at a time
    first = trials[0].run
    assert first.config_overrides["actor_rollout_ref.actor.optim.lr"] == trials[0].params["actor_rollout_ref.actor.optim.lr"]
    assert first.config_overrides["trainer.total_training_steps"] == 2  # the base run's overrides stay
    assert first.agent_id == base.agent_id and first.name == "lr grid #0"

    with django_capture_on_commit_callbacks(execute=True):
        end(trials[0].run, "succeeded", reward=0.4)
    assert sweep.trials.count() == 3  # the grid's last point started in the freed slot
    with django_capture_on_commit_callbacks(execute=True):
        end(trials[1].run, "failed")
        end(Trial.objects.get(number=2).run, "succeeded", reward=0.7)
    sweep.refresh_from_db()
    assert sweep.status == "finished" and sweep.trials.count() == 3  # 3 grid points, never more
    states = dict(sweep.trials.values_list("number", "state"))
    assert states == {0: "complete", 1: "failed", 2: "complete"}
    lrs = sorted(t.params["actor_rollout_ref.actor.optim.lr"] for t in sweep.trials.all())
    assert lrs == [0.0001, 0.001, 0.01]  # each point once

    page = owner_client.get(f"/sweeps/{sweep.pk}/").content.decode()
    assert 'id="sweep-best"' in page and "trial 2" in page and "0.7" in page
    assert page.count('class="trial trial-') == 3 and 'id="sweep-charts"' in page
    # The charts' points, as the page's script reads them: one JSON decode gives numbers.
    points = json.loads(re.search(r'<script id="sweep-points" type="application/json">(.*?)</script>', page).group(1))
    assert [(p["value"], p["params"]["actor_rollout_ref.actor.optim.lr"]) for p in points if p["value"] is not None] == [
        (0.4, trials[0].params["actor_rollout_ref.actor.optim.lr"]), (0.7, Trial.objects.get(number=2).params["actor_rollout_ref.actor.optim.lr"])]


def test_a_hopeless_trial_is_pruned_and_stopped(make_run, owner, queued):
    base = make_run(name="base")
    sweep = Sweep.objects.create(owner=owner, name="prune", base_run=base, space={"actor_rollout_ref.actor.optim.lr": "float 1e-4..1e-2 log"},
                                 sampler="random", max_trials=5, parallel=3, prune=True)
    engine.launch(sweep.pk)
    good, also_good, hopeless = [t.run for t in sweep.trials.order_by("number")]
    for run in (good, also_good):
        SeriesWriter(run.pk).write([("reward", step, 0.5 + 0.1 * step) for step in (1, 2, 3)])
        end(run, "succeeded", reward=0.8)
    assert hopeless.claim("test-worker")
    sink = engine.PruningSink(hopeless)
    sink.log_metrics(1, {"reward": 0.0})
    assert not hopeless.cancel_requested()  # the first step is the pruner's warm-up
    sink.log_metrics(2, {"reward": 0.0})
    assert hopeless.cancel_requested() and Trial.objects.get(run=hopeless).state == "pruned"
    # The worker ends the stopped run as it ends any stop: the status says the pruner did it, since
    # "cancelled" means a person did (and sets off the owner's cancel alerts).
    from workers.lifecycle import record_end

    assert record_end(hopeless, cancelled=True, steps=2, metrics={"reward": 0.0}, checkpoint="") == "pruned"
    hopeless.refresh_from_db()
    assert hopeless.status == "pruned" and hopeless.is_final and hopeless.steps == 2
    assert Trial.objects.get(run=hopeless).state == "pruned"


def test_a_person_cancelling_a_trial_still_cancels_it(make_run, owner, queued):
    from workers.lifecycle import record_end

    base = make_run(name="base")
    sweep = Sweep.objects.create(owner=owner, name="cancel", base_run=base, space={"data.train_batch_size": "choice 2"},
                                 sampler="grid", max_trials=1, parallel=1, prune=True)
    engine.launch(sweep.pk)
    run = sweep.trials.get().run
    assert run.claim("test-worker") and run.request_cancel()
    assert record_end(run, cancelled=True, steps=1, metrics={}, checkpoint="") == "cancelled"
    assert Trial.objects.get(run=run).state == "failed"


def test_the_api_starts_a_sweep_and_refuses_bad_spaces(api_client, make_run, owner, stranger, queued):
    base = make_run(name="base")
    client = api_client(owner)
    body = {"name": "api", "base_run": base.pk, "space": {"actor_rollout_ref.rollout.n": "int 2..4"}, "sampler": "random",
            "max_trials": 3, "parallel": 1}
    response = client.post("/api/sweeps/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["trials"][0]["run"] == queued[0] and len(queued) == 1

    for space, message in [
        ({"trainer.python": "choice /bin/sh"}, "trainer.python cannot be set per run"),
        ({"data.train_batch_sizee": "choice 2"}, "data.train_batch_sizee: not a config key"),
        ({"data.train_batch_size": "choice 0, 2"}, "data.train_batch_size=0 would fail every trial"),
        ({"data.train_batch_size": "between 1 and 2"}, "expected 'choice a, b, c'"),
        (["not", "a", "mapping"], "An object of config key to range"),
    ]:
        response = client.post("/api/sweeps/", {**body, "space": space}, format="json")
        assert response.status_code == 400 and message in str(response.json()["space"]), (space, response.json())
    assert client.post("/api/sweeps/", {**body, "max_trials": 10_000}, format="json").status_code == 400
    # A stranger can neither sweep the owner's run nor see the sweep.
    assert api_client(stranger).post("/api/sweeps/", body, format="json").status_code == 404
    assert api_client(stranger).get(f"/api/sweeps/{Sweep.objects.first().pk}/").status_code == 404


def test_cancelling_a_sweep_stops_its_trials(owner_client, make_run, owner, queued):
    base = make_run(name="base")
    sweep = Sweep.objects.create(owner=owner, name="c", base_run=base, space={"data.train_batch_size": "choice 2, 4"},
                                 sampler="grid", max_trials=2, parallel=2)
    engine.launch(sweep.pk)
    owner_client.post(f"/sweeps/{sweep.pk}/cancel/")
    sweep.refresh_from_db()
    assert sweep.status == "cancelled"
    assert set(Run.objects.filter(sweep_trial__sweep=sweep).values_list("status", flat=True)) == {"cancelled"}


def test_the_form_says_every_problem_of_the_space_with_its_line_and_a_misspelt_objective(owner_client, make_run, queued):
    base = make_run(name="base", status="succeeded", final_metrics={"reward": 0.5, "val/reward": 0.4})
    space = ("actor_rollout_ref.actor.optim.lr: float 1e-2..1e-4 log\n"
             "# a comment line\n"
             "data.train_batch_size: choice 2, many\n"
             "trainer.total_epoch: choice 1, 2\n")
    response = owner_client.post("/sweeps/new/", {
        "base": base.pk, "name": "bad", "space": space, "sampler": "random", "objective": "rewad",
        "direction": "maximize", "max_trials": 4, "parallel": 1, "seed": 0,
    })
    errors = response.context["form"].errors
    assert [message.split(":")[0] for message in errors["space"]] == ["line 1", "line 3", "line 4"], errors["space"]
    assert "is reversed" in errors["space"][0] and "write float 1e-4..1e-2" in errors["space"][0]
    assert "data.train_batch_size='many' would fail every trial" in errors["space"][1]
    assert "Did you mean 'trainer.total_epochs'?" in errors["space"][2]
    assert "'rewad' is not a metric run" in errors["objective"][0] and "Did you mean 'reward'?" in errors["objective"][0]
    assert Sweep.objects.count() == 0 and queued == []
