"""One person, or their sweeps, cannot take every worker: a quota of queued and running runs per
person (``RUN_QUOTA_PER_PERSON``) and per project (``RUN_QUOTA_PER_PROJECT``), counted where every
platform run is created (``webapp.runs.submission.submit``), sweep trials included; each trial is
checked as the run form checks a run; a sweep's space is small; a sweep whose owner left the team
starts nothing more."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from webapp.runs import submission
from webapp.runs.models import Run
from webapp.sweeps import engine
from webapp.sweeps.models import Sweep, Trial
from webapp.teams.models import Membership

from .test_run_files import TINY

PERSON_FULL = "You have 2 runs queued or running, the most one person may have (2); wait for one to end or cancel one."


@pytest.fixture
def quota(settings):
    settings.RUN_QUOTA_PER_PERSON = 2
    settings.RUN_QUOTA_PER_PROJECT = 3
    return settings


def form_data(registry, **extra) -> dict:
    return {"agent": registry["agents"]["copy-task"].pk, "dataset": registry["datasets"]["copy"].pk,
            "reward": registry["rewards"]["char-accuracy"].pk, "backend": registry["backends"]["trl"].pk,
            "model": "tiny-char", "overrides": "\n".join(f"{k}={v}" for k, v in TINY.items()), **extra}


def api_body(**extra) -> dict:
    return {"agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl", "model": "tiny-char",
            "overrides": dict(TINY), **extra}


def test_one_person_queues_at_most_their_quota(owner_client, owner, registry, quota, apply_async):
    for _ in range(2):
        assert owner_client.post("/runs/new/", form_data(registry)).status_code == 302
    response = owner_client.post("/runs/new/", form_data(registry))
    assert response.status_code == 200 and PERSON_FULL in response.content.decode()
    assert list(response.context["form"].non_field_errors()) == [PERSON_FULL]
    assert Run.objects.count() == 2
    Run.objects.first().request_cancel()  # a cancelled (or ended) run frees its place
    assert owner_client.post("/runs/new/", form_data(registry)).status_code == 302
    assert Run.objects.filter(status="queued").count() == 2


def test_the_api_answers_429_with_the_same_words(api_client, owner, quota, apply_async, registry):
    client = api_client(owner)
    assert [client.post("/api/runs/", api_body(), format="json").status_code for _ in range(2)] == [201, 201]
    response = client.post("/api/runs/", api_body(), format="json")
    assert response.status_code == 429 and response.json() == {"detail": PERSON_FULL}
    assert Run.objects.count() == 2
    # Runs trained elsewhere take no worker and are not counted.
    assert client.post("/api/runs/", {"kind": "external", "name": "notebook"}, format="json").status_code == 201


def test_a_project_queues_at_most_its_quota_whoever_asks(api_client, owner, teammate, project, quota, apply_async, registry):
    in_project = api_body(project=project.pk, visibility="team")
    assert api_client(owner).post("/api/runs/", in_project, format="json").status_code == 201
    assert api_client(owner).post("/api/runs/", in_project, format="json").status_code == 201
    assert api_client(teammate).post("/api/runs/", in_project, format="json").status_code == 201
    response = api_client(teammate).post("/api/runs/", in_project, format="json")
    assert response.status_code == 429
    assert response.json()["detail"].startswith(f"Project {project.name} has 3 runs queued or running, the most one project may have (3)")
    assert api_client(teammate).post("/api/runs/", api_body(), format="json").status_code == 201  # a personal run still may
    assert Run.objects.filter(project=project).count() == 3


def test_platform_admins_are_not_limited(api_client, admin_user, quota, apply_async, registry):
    client = api_client(admin_user)
    assert [client.post("/api/runs/", api_body(), format="json").status_code for _ in range(3)] == [201] * 3


@pytest.mark.django_db(transaction=True)
def test_two_submissions_at_once_cannot_both_take_the_last_place(owner, registry, settings, monkeypatch):
    """Each counts, then waits (up to a second) for the other to count too, then creates. With the
    row lock the second cannot count until the first has committed, so it sees the first's run."""
    settings.RUN_QUOTA_PER_PERSON = 1
    both_counted = threading.Barrier(2, timeout=1)
    count = submission._active

    def count_then_wait(**where):
        counted = count(**where)
        try:
            both_counted.wait()
        except threading.BrokenBarrierError:
            pass
        return counted

    monkeypatch.setattr(submission, "_active", count_then_wait)
    monkeypatch.setattr(Run, "enqueue", lambda self: None)
    outcomes: list[str] = []

    def submit() -> None:
        try:
            submission.submit(owner=owner, agent=registry["agents"]["copy-task"], dataset=registry["datasets"]["copy"],
                              backend=registry["backends"]["trl"], model="tiny-char", config_overrides=dict(TINY))
            outcomes.append("queued")
        except submission.QuotaExceeded as exc:
            outcomes.append(str(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["You have 1 run queued or running, the most one person may have (1); wait for one to end or cancel one.",
                                "queued"]
    assert Run.objects.count() == 1


# -- sweeps ---------------------------------------------------------------------------------------

SWEEP = {"name": "wide", "space": {"actor_rollout_ref.actor.optim.lr": "choice 0.1, 0.01, 0.001, 0.0001"},
         "sampler": "grid", "max_trials": 4, "parallel": 4}


def test_sweep_trials_count_in_the_quota(api_client, owner, make_run, quota, apply_async):
    base = make_run(status=Run.Status.SUCCEEDED)
    client = api_client(owner)
    response = client.post("/api/sweeps/", {**SWEEP, "base_run": base.pk}, format="json")
    assert response.status_code == 201 and len(response.json()["trials"]) == 2  # 4 asked at once, 2 allowed
    # Five more sweeps queue nothing more: each is refused, and none is kept.
    for _ in range(5):
        response = client.post("/api/sweeps/", {**SWEEP, "base_run": base.pk}, format="json")
        assert response.status_code == 429 and PERSON_FULL in response.json()["detail"], response.json()
    assert Sweep.objects.count() == 1 and Run.objects.filter(status="queued").count() == 2


def test_a_full_quota_waits_while_the_sweeps_own_trials_run(owner, make_run, quota, apply_async,
                                                             django_capture_on_commit_callbacks):
    base = make_run(status=Run.Status.SUCCEEDED)
    sweep = engine.create(owner=owner, base_run=base, **SWEEP)
    first, second = [t.run for t in sweep.trials.order_by("number")]
    with django_capture_on_commit_callbacks(execute=True):
        assert first.claim("w") and first.finish("succeeded", final_metrics={"reward": 0.5})
    sweep.refresh_from_db()
    assert sweep.status == "running" and sweep.trials.count() == 3  # the freed place went to the next trial
    assert Run.objects.filter(status__in=("queued", "running")).count() == 2


def test_a_sweep_cannot_start_when_the_quota_is_full(owner_client, owner, make_run, quota, apply_async):
    base = make_run(status=Run.Status.SUCCEEDED)
    make_run(), make_run()  # two queued runs of the owner's: the quota is full
    response = owner_client.post("/sweeps/new/", {
        "base": base.pk, "name": "s", "space": "data.train_batch_size: choice 2", "sampler": "grid",
        "objective": "reward", "direction": "maximize", "max_trials": 1, "parallel": 1, "seed": 0})
    assert response.status_code == 200
    assert f"No trial could start, so the sweep was not created: {PERSON_FULL}" in " ".join(response.context["form"].non_field_errors())
    assert not Sweep.objects.exists() and Run.objects.count() == 3


def test_each_trial_is_checked_as_the_run_form_checks_a_run(api_client, owner, make_run, apply_async):
    """Each value passes on the base run's overrides, but the grid's one point does not: a mini-batch
    of 4 does not divide a batch of 2. The run form's check refuses the trial, so nothing is queued."""
    base = make_run(status=Run.Status.SUCCEEDED, config_overrides={**TINY, "data.train_batch_size": 4})
    response = api_client(owner).post("/api/sweeps/", {
        "name": "clash", "base_run": base.pk, "sampler": "grid", "max_trials": 1, "parallel": 1,
        "space": {"data.train_batch_size": "choice 2", "actor_rollout_ref.actor.ppo_mini_batch_size": "choice 4"}}, format="json")
    assert response.status_code == 400, response.content
    message = " ".join(response.json()["non_field_errors"])
    assert "No trial could start" in message and "actor_rollout_ref.actor.ppo_mini_batch_size" in message and "must divide" in message
    assert not Sweep.objects.exists() and Run.objects.count() == 1 and not apply_async.called


def test_a_later_trial_that_is_refused_stops_the_sweep_with_the_reason(owner, make_run, registry, apply_async,
                                                                        django_capture_on_commit_callbacks):
    base = make_run(status=Run.Status.SUCCEEDED)
    sweep = engine.create(owner=owner, base_run=base, **{**SWEEP, "parallel": 1})
    registry["backends"]["trl"].__class__.objects.filter(name="trl").update(enabled=False)  # an admin disables it
    with django_capture_on_commit_callbacks(execute=True):
        run = sweep.trials.get().run
        assert run.claim("w") and run.finish("succeeded", final_metrics={"reward": 0.5})
    sweep.refresh_from_db()
    assert sweep.status == "stopped" and sweep.trials.count() == 1
    assert sweep.stop_reason.startswith("Stopped: trial 1 (actor_rollout_ref.actor.optim.lr=") and "disabled" in sweep.stop_reason


def test_a_sweep_whose_owner_left_the_team_starts_nothing_more(page_client, teammate, make_run, project, apply_async,
                                                              django_capture_on_commit_callbacks):
    base = make_run(owner=teammate, project=project, visibility="team", status=Run.Status.SUCCEEDED)
    sweep = engine.create(owner=teammate, base_run=base, **{**SWEEP, "parallel": 1})
    Membership.objects.filter(user=teammate).delete()
    with django_capture_on_commit_callbacks(execute=True):
        run = sweep.trials.get().run
        assert run.claim("w") and run.finish("succeeded", final_metrics={"reward": 0.5})
    sweep.refresh_from_db()
    assert sweep.status == "stopped" and Trial.objects.filter(sweep=sweep).count() == 1
    assert sweep.stop_reason == (f"Stopped before trial 1: teammate may no longer start runs from run {base.pk} in project "
                                 f"{project.name} (they left its team, or their role there changed).")
    page = page_client(teammate).get(f"/sweeps/{sweep.pk}/").content.decode()
    assert 'id="sweep-stop-reason"' in page and "may no longer start runs" in page
    assert Run.objects.filter(status="queued").count() == 0


def test_a_viewer_now_cannot_sweep_or_clone_their_old_run(page_client, teammate, make_run, project):
    base = make_run(owner=teammate, project=project, visibility="team", status=Run.Status.SUCCEEDED)
    Membership.objects.filter(user=teammate).update(role=Membership.Role.VIEWER)
    client = page_client(teammate)
    assert client.get(f"/sweeps/new/?base={base.pk}").status_code == 404
    assert client.get(f"/runs/new/?clone={base.pk}").status_code == 404
    assert client.get(f"/runs/{base.pk}/").status_code == 200  # still theirs to look at


@pytest.mark.parametrize("space,message", [
    ({"actor_rollout_ref.actor.optim.lr": "choice " + ", ".join(f"0.{i:04d}" for i in range(1, 1501))},
     "at most 100 values in all (each choice, and each range's two ends; got 1500)"),
    ({"actor_rollout_ref.actor.optim.lr": [0.001] * 1500}, "got 1500"),
    ({"actor_rollout_ref.actor.optim.lr": {"type": "choice", "values": [0.001] * 1500}}, "got 1500"),
    ({f"k{i}": "choice 1" for i in range(11)}, "at most 10 config keys (got 11)"),
])
def test_a_large_space_is_refused_before_it_costs_the_web_process(api_client, owner, make_run, apply_async, space, message):
    base = make_run(status=Run.Status.SUCCEEDED)
    started = time.perf_counter()
    response = api_client(owner).post("/api/sweeps/", {"name": "big", "base_run": base.pk, "space": space,
                                                       "sampler": "random", "max_trials": 3, "parallel": 1}, format="json")
    assert time.perf_counter() - started < 2
    assert response.status_code == 400 and message in str(response.json()["space"]), response.json()
    assert not Sweep.objects.exists() and not apply_async.called
