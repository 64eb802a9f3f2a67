"""A platform user reaches no files but their own run's, and runs no model code an admin did not trust.

Replays issue-style attacks: ``trust_remote_code`` with a model whose ``auto_map`` names a Python
file, ``trainer.default_local_dir`` into another user's run folder, another run's ``final_model``,
``/etc`` and ``../../`` as the model, and a new run #N after a database reset next to an old run
#N's checkpoint. Each goes through the API and the form, and again straight to the worker's
``train_run`` (as if a row got past the form), where nothing may happen either.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from webapp.registry.models import Model
from webapp.dashboard.series import points_after
from webapp.runs.models import Run
from workers.execute import claim, train_run

TRUST = "actor_rollout_ref.model.trust_remote_code"
TINY = {"trainer.total_training_steps": 2, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
        "data.max_response_length": 4}


@pytest.fixture
def roots(settings, tmp_path, db):
    settings.RUNS_DIR = tmp_path / "runs"
    settings.MODEL_ROOTS = [tmp_path / "models"]
    return tmp_path


@pytest.fixture
def evil_model(roots):
    """A real (tiny) model directory whose config.json maps AutoConfig/AutoModel to evil.py, which
    writes a marker file (with its PID) when imported."""
    from training.rollouts.tiny import save_tiny_model

    directory = save_tiny_model(roots / "models" / "evil", seed=1)
    marker = roots / "evil-ran"
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "evil.py").write_text(
        "import os\n"
        f"open({str(marker)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "from transformers import Qwen2Config as EvilConfig, Qwen2ForCausalLM as EvilModel\n"
    )
    entry = Model.objects.create(name="evil", source=Model.Source.PATH, identifier=str(directory))
    return entry, marker


def post_run(client, **fields):
    body = {"agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl", "model": "tiny-char",
            "overrides": dict(TINY)}
    body.update(fields)
    return client.post("/api/runs/", body, content_type="application/json")


def form_errors(client, registry, **fields):
    data = {"agent": registry["agents"]["copy-task"].pk, "dataset": registry["datasets"]["copy"].pk,
            "reward": registry["rewards"]["char-accuracy"].pk, "backend": registry["backends"]["trl"].pk,
            "model": "tiny-char", "overrides": "\n".join(f"{k}={v}" for k, v in TINY.items())}
    data.update(fields)
    response = client.post("/runs/new/", data)
    assert response.status_code == 200, "a refused form re-renders the page"
    return response.context["form"].errors


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_evil_model_is_live(evil_model, tmp_path):
    """Control: trusting the model does run evil.py, so the refusals below are what keeps it from
    running. (In a process of its own: transformers caches remote code modules process-wide.)"""
    import os
    import subprocess
    import sys

    entry, marker = evil_model
    code = f"from transformers import AutoConfig; AutoConfig.from_pretrained({entry.identifier!r}, trust_remote_code=True)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                   env={**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"})
    assert marker.is_file()


def test_trust_remote_code_is_refused_by_the_api_and_the_form(owner_client, registry, evil_model):
    entry, marker = evil_model
    response = post_run(owner_client, model="evil", overrides={**TINY, TRUST: True})
    assert response.status_code == 400
    assert TRUST in json.dumps(response.json()["overrides"]) and "administrator" in json.dumps(response.json())
    errors = form_errors(owner_client, registry, model="evil", overrides=f"{TRUST}=true")
    assert TRUST in " ".join(errors["overrides"])
    # Nested YAML names the same key.
    errors = form_errors(owner_client, registry, model="evil",
                         overrides="actor_rollout_ref:\n  model:\n    trust_remote_code: true\n")
    assert TRUST in " ".join(errors["overrides"])
    assert not Run.objects.exists() and not marker.exists()


@pytest.mark.django_db(transaction=True)
def test_trust_remote_code_that_reached_a_worker_stays_off(make_run, evil_model):
    entry, marker = evil_model
    run = make_run(model="evil", config_overrides={**TINY, "trainer.total_training_steps": 1, TRUST: True})
    claim(run.pk, "w")
    train_run(run.pk)
    run.refresh_from_db()
    assert run.final_config["actor_rollout_ref"]["model"]["trust_remote_code"] is False
    assert not marker.exists(), "the model's own code ran"


def test_an_admin_trusted_model_is_the_only_way_to_its_code(evil_model):
    from webapp.runs.trainer_args import model_config

    entry, _ = evil_model
    assert model_config("evil")[TRUST] is False
    Model.objects.filter(pk=entry.pk).update(trust_remote_code=True)
    assert model_config("evil")[TRUST] is True


@pytest.fixture
def strangers_run(roots, registry, stranger):
    """A succeeded run of another user, with a checkpoint and a final model in its folder."""
    run = Run.objects.create(owner=stranger, agent=registry["agents"]["copy-task"], dataset=registry["datasets"]["copy"],
                             reward=registry["rewards"]["char-accuracy"], backend=registry["backends"]["trl"],
                             model="tiny-char", status=Run.Status.SUCCEEDED)
    folder = run.folder()
    Run.objects.filter(pk=run.pk).update(run_path=str(folder))
    run.refresh_from_db()
    checkpoint = folder / "checkpoints" / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 10}')
    (checkpoint / "model.safetensors").write_bytes(b"the stranger's weights")
    from training.rollouts.tiny import save_tiny_model

    save_tiny_model(folder / "final_model")
    return run


@pytest.mark.parametrize("value", ["STRANGER", "/etc", "../../", "/tmp"])
def test_paths_in_overrides_are_refused(owner_client, registry, strangers_run, value):
    target = str(strangers_run.folder() / "checkpoints") if value == "STRANGER" else value
    for key in ("trainer.default_local_dir", "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path"):
        response = post_run(owner_client, overrides={**TINY, key: target})
        assert response.status_code == 400 and key in json.dumps(response.json()["overrides"]), response.json()
        assert key in " ".join(form_errors(owner_client, registry, overrides=f"{key}={target}")["overrides"])
    assert Run.objects.filter(owner__username="owner").count() == 0


@pytest.mark.parametrize("value", ["FINAL_MODEL", "RUN", "/etc", "../../", "", "Qwen/Qwen2.5-0.5B"])
def test_the_model_is_one_of_the_admins_list_or_a_visible_run(owner_client, registry, strangers_run, value):
    model = {"FINAL_MODEL": str(strangers_run.folder() / "final_model"), "RUN": f"run:{strangers_run.pk}"}.get(value, value)
    response = post_run(owner_client, model=model)
    assert response.status_code == 400 and "model" in response.json(), response.json()
    assert "model" in form_errors(owner_client, registry, model=model)
    assert Run.objects.filter(owner__username="owner").count() == 0


def test_a_run_the_user_may_see_offers_its_trained_model(client, registry, strangers_run, no_queue):
    client.force_login(strangers_run.owner)
    response = post_run(client, model=f"run:{strangers_run.pk}")
    assert response.status_code == 201, response.json()
    from webapp.runs.trainer_args import run_trainer_kwargs

    run = Run.objects.get(pk=response.json()["id"])
    config = run_trainer_kwargs(run, "unused")["config"]
    assert config["actor_rollout_ref.model.path"] == str(strangers_run.folder() / "final_model")


def test_model_entries_by_path_stay_under_the_model_roots(roots):
    from django.core.exceptions import ValidationError

    for identifier in ("/etc", str(roots / "models" / ".." / "runs"), "relative/dir"):
        with pytest.raises(ValidationError):
            Model(name="x", source=Model.Source.PATH, identifier=identifier).full_clean()
    with pytest.raises(ValidationError):
        Model(name="x", source=Model.Source.HUB, identifier="../../etc").full_clean()


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_dir_that_reached_a_worker_is_the_runs_own(make_run, strangers_run):
    before = tree_digest(strangers_run.folder())
    run = make_run(config_overrides={**TINY, "trainer.save_freq": 1, "trainer.max_checkpoints": 1,
                                     "trainer.default_local_dir": str(strangers_run.folder() / "checkpoints")})
    claim(run.pk, "w")
    assert train_run(run.pk) == Run.Status.SUCCEEDED, Run.objects.get(pk=run.pk).error
    run.refresh_from_db()
    assert tree_digest(strangers_run.folder()) == before, "the other user's folder changed"
    assert (run.folder() / "checkpoints").is_dir() and run.folder() != strangers_run.folder()


@pytest.mark.django_db(transaction=True)
def test_a_new_run_never_resumes_from_an_old_runs_folder_after_a_database_reset(make_run, roots):
    """Old run #N left checkpoint-10 on disk; the database was reset and a new run got id N again."""
    old = make_run(config_overrides=TINY)
    old_folder, pk = old.folder(), old.pk
    for folder in (old_folder, roots / "runs" / str(pk)):  # today's layout, and the one before run uids
        checkpoint = folder / "checkpoints" / "checkpoint-10"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text('{"global_step": 10}')
    old.delete()
    new = make_run(pk=pk, config_overrides=TINY)
    assert new.folder() not in (old_folder, roots / "runs" / str(pk))
    claim(new.pk, "w")
    assert train_run(new.pk) == Run.Status.SUCCEEDED, Run.objects.get(pk=new.pk).error
    steps = {step for step, _ in points_after(new.pk, -1)["reward"]}
    assert steps == {1, 2}


def test_members_list_the_models_they_may_choose(owner_client, registry, evil_model):
    names = [m["name"] for m in owner_client.get("/api/models/").json()["results"]]
    assert "tiny-char" in names and "evil" in names
    page = owner_client.get("/runs/new/").content.decode()
    assert 'value="tiny-char"' in page and 'value="evil"' in page


def test_every_config_key_naming_a_place_is_set_by_the_platform_only():
    """A new key such as ``trainer.foo_dir`` must be marked ``location=True`` in training/config/schema.py."""
    import re

    from training.config import valid_keys
    from webapp.policy.keys import platform_set_keys

    looks_like_a_place = [key for key in valid_keys() if re.search(r"(path|dir|file|url|address|python|root)$", key)]
    assert looks_like_a_place and set(looks_like_a_place) <= set(platform_set_keys())


def test_model_access_follows_the_team(client, registry, project, teammate, stranger, strangers_run, no_queue):
    """A project's model is its team's; a team-visible run's trained model is there for its team to start from."""
    Model.objects.create(name="team-model", source=Model.Source.BUILTIN, identifier="tiny-char", project=project)
    Run.objects.filter(pk=strangers_run.pk).update(project=project, visibility=Run.Visibility.TEAM)
    client.force_login(stranger)
    assert "team-model" in json.dumps(post_run(client, model="team-model").json()["model"])
    client.force_login(teammate)
    assert post_run(client, model="team-model").status_code == 201
    assert post_run(client, model=f"run:{strangers_run.pk}").status_code == 201
    Run.objects.filter(pk=strangers_run.pk).update(visibility=Run.Visibility.PRIVATE)
    assert post_run(client, model=f"run:{strangers_run.pk}").status_code == 400


@pytest.mark.parametrize("key", ["+trainer.default_local_dir", "rllm.env.env_args.reward_fn", "+rllm.env.env_args.reward_fn",
                                 "rllm.agent.agent_args", "rllm.workflow.workflow_args.solver", "rllm.agent.engine_args.x"])
def test_keys_that_reach_registry_code_or_files_are_refused_in_any_spelling(owner_client, registry, key):
    response = post_run(owner_client, overrides={**TINY, key: "os.system"})
    assert response.status_code == 400 and key in json.dumps(response.json()["overrides"]), response.json()
    assert not Run.objects.exists()
