"""tinker, fireworks and swift on the platform: seeded, their readiness shown to admins, refused
by the run form when their credentials or environment are missing, remote ids on the run page,
and a cancelled fireworks run deletes what it provisioned.

Stand-in: Fireworks' platform (``standins.fireworks_service``, a loopback server speaking the SDK's
wire formats); the worker's ``train_run``, the database and the SDK are real.
"""

from pathlib import Path

import pytest

from webapp.runs.models import Run

URL = "/runs/new/"


def test_the_three_backends_are_seeded_and_offered(owner_client, registry):
    backends = registry["backends"]
    assert {"tinker", "fireworks", "swift"} <= set(backends)
    assert backends["swift"].python == ".venv-swift/bin/python"
    page = owner_client.get(URL).content.decode()
    for name in ("tinker", "fireworks", "swift"):
        assert f"{name} — {name}" in page
    listed = {b["name"]: b for b in owner_client.get("/api/backends/").json()["results"]}
    assert listed["tinker"]["status"]["credentials"].startswith("TINKER_API_KEY is not set")


def test_admin_shows_whether_environment_imports_and_credentials_are_set(admin_client_, registry, monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.setenv("FIREWORKS_API_KEY", "fw-set")
    page = admin_client_.get("/admin/registry/backend/").content.decode()
    assert "Environment imports" in page and "Credentials set" in page
    assert "missing: TINKER_API_KEY is not set" in page
    assert "missing: FIREWORKS_API_KEY" not in page
    broken = registry["backends"]["swift"]
    broken.python = "/nowhere/python"
    broken.save()
    page = admin_client_.get("/admin/registry/backend/").content.decode()
    assert "missing: its environment /nowhere/python does not exist" in page


def test_a_backend_with_its_own_interpreter_is_checked_in_that_interpreter(admin_client_, registry):
    """The swift backend's status comes from its python (a subprocess importing ms-swift there),
    not from the web process: this process's interpreter has no ms-swift, .venv-swift has."""
    import sys

    from training.isolation import interpreters
    from training.backends.swift.backend import DEFAULT_PYTHON

    interpreters.forget()
    swift = registry["backends"]["swift"]
    swift.python = sys.executable
    swift.save()
    page = admin_client_.get("/admin/registry/backend/").content.decode()
    assert f"missing: its environment {sys.executable} cannot import swift" in page
    assert "No module named &#x27;swift&#x27;" in page
    listed = {b["name"]: b for b in admin_client_.get("/api/backends/").json()["results"]}
    assert "No module named 'swift'" in listed["swift"]["status"]["environment"]
    if DEFAULT_PYTHON.is_file():  # built by `make swift-env` (make test builds it)
        swift.python = ".venv-swift/bin/python"
        swift.save()
        listed = {b["name"]: b for b in admin_client_.get("/api/backends/").json()["results"]}
        assert listed["swift"]["status"]["environment"] is None


def test_an_interpreter_set_on_a_backend_that_would_not_use_it_is_reported(owner_client, registry):
    trl = registry["backends"]["trl"]
    trl.python = ".venv-swift/bin/python"
    trl.save()
    listed = {b["name"]: b for b in owner_client.get("/api/backends/").json()["results"]}
    assert "the trl backend trains in the worker's own process and would not use it" in listed["trl"]["status"]["environment"]


def test_the_form_refuses_a_backend_without_credentials_naming_them(owner_client, copy_form_data, registry, monkeypatch):
    monkeypatch.delenv("FIREWORKS_API_KEY", raising=False)
    response = owner_client.post(URL, {**copy_form_data, "backend": registry["backends"]["fireworks"].pk})
    errors = response.context["form"].errors
    assert "FIREWORKS_API_KEY is not set" in " ".join(errors["backend"])
    assert Run.objects.count() == 0


def test_the_api_refuses_a_tinker_run_without_its_key_before_anything_is_queued(owner, api_client, registry, no_queue, monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    response = api_client(owner).post("/api/runs/", {
        "name": "tinker run", "agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "tinker",
        "model": "tiny-char", "overrides": {"data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2},
    }, format="json")
    assert response.status_code == 400
    assert "TINKER_API_KEY is not set" in " ".join(response.json()["backend"]), response.json()
    assert Run.objects.count() == 0


def test_the_form_refuses_a_backend_whose_environment_is_missing(owner_client, copy_form_data, registry):
    swift = registry["backends"]["swift"]
    swift.python = "/nowhere/python"
    swift.save()
    response = owner_client.post(URL, {**copy_form_data, "backend": swift.pk})
    assert "its environment /nowhere/python does not exist" in " ".join(response.context["form"].errors["backend"])
    assert Run.objects.count() == 0


@pytest.mark.parametrize("override", ["trainer.python=/bin/sh", "remote.base_url=http://attacker.example",
                                      "actor_rollout_ref.rollout.server_url=http://169.254.169.254"])
def test_a_run_cannot_choose_the_interpreter_or_the_service_that_gets_the_api_key(owner_client, copy_form_data, override):
    response = owner_client.post(URL, {**copy_form_data, "overrides": override})
    assert "chosen by the backend's administrator" in " ".join(response.context["form"].errors["overrides"])
    assert Run.objects.count() == 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_cancelled_fireworks_run_deletes_its_job_and_deployment_and_shows_their_ids(make_run, registry, tmp_path, settings, monkeypatch, owner_client):
    from standins.fireworks_service import FireworksStandIn
    from workers.execute import claim, train_run

    platform = FireworksStandIn()
    monkeypatch.setenv("FIREWORKS_API_KEY", platform.api_key)
    settings.RUNS_DIR = tmp_path
    try:
        fireworks = registry["backends"]["fireworks"]
        fireworks.default_config = {"remote.base_url": platform.url, "remote.poll_interval_s": 0.05}  # as an admin sets it
        fireworks.save()
        run = make_run(backend=fireworks, config_overrides={
            "trainer.total_training_steps": 50, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
            "data.max_response_length": 2,
        })
        claim(run.pk, "test-worker")
        run.request_cancel()
        assert train_run(run.pk) == Run.Status.CANCELLED
    finally:
        platform.close()
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED, run.error
    assert set(run.remote_ids) == {"fireworks_trainer_job", "fireworks_deployment"}
    assert platform.running() == []
    assert sorted(platform.deleted) == sorted([f"job:{run.remote_ids['fireworks_trainer_job']}", f"deployment:{run.remote_ids['fireworks_deployment']}"])
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert run.remote_ids["fireworks_deployment"] in page and "fireworks_trainer_job" in page


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_multi_turn_swift_run_trains_through_the_worker_in_the_backends_interpreter(make_run, registry, tmp_path, settings):
    """The seeded swift backend, its python (.venv-swift) honoured by the worker's train_run: a
    FrozenLake run trains multi-turn through ms-swift and its steps and turns reach the database.
    Nothing is a stand-in."""
    from training.backends.swift.backend import DEFAULT_PYTHON, environment_problem
    from webapp.dashboard.series import points_after
    from workers.execute import claim, train_run

    if environment_problem(DEFAULT_PYTHON) is not None:
        pytest.skip("no .venv-swift here; `make swift-env` builds it (make test does)")
    settings.RUNS_DIR = tmp_path
    run = make_run(backend=registry["backends"]["swift"], agent=registry["agents"]["frozenlake"],
                   dataset=registry["datasets"]["frozenlake"], reward=None, config_overrides={
                       "trainer.total_training_steps": 2, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
                       "rllm.agent.max_steps": 4, "rllm.agent.max_tokens_per_turn": 1, "data.max_response_length": 16,
                   })
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.steps == 2, run.traceback
    job = (Path(run.run_path) / "attempts" / str(run.attempts) / "swift" / "job.json").read_text()  # the attempt's own
    assert '"max_turns": 4' in job and "FrozenLakeEnv" in job
    turns = [value for _, value in points_after(run.pk, -1)["turns"]]
    assert len(turns) == 2 and all(t > 1 for t in turns), turns
