"""A whole section given as one key (``rllm.workflow={"workflow_args": {...}}``) is many keys to the
trainer: every place that takes a member's config judges the keys it sets, flattened to their
leaves, on the rule of ``webapp.policy.keys.refused_overrides``. Each attack goes through its
real entry as a team member: the run form, the API, a sweep (its space and its base run), a clone,
and the worker's merge of a row stored before the rule."""

from __future__ import annotations

import json

import pytest

from training.config import Config
from webapp.runs.models import Run
from webapp.runs.trainer_args import run_trainer_kwargs
from webapp.sweeps.models import Sweep

from .test_run_files import TINY

TINY_LINES = "\n".join(f"{key}={value}" for key, value in TINY.items())

# (override line as typed, the leaf key the refusal must name)
SECTION_ATTACKS = [
    ('rllm.workflow={"workflow_args": {"reward_function": "subprocess.getoutput"}}', "rllm.workflow.workflow_args.reward_function"),
    ('rllm.env={"env_args": {"reward_fn": "subprocess.getoutput"}}', "rllm.env.env_args.reward_fn"),
    ('rllm={"agent": {"agent_args": {"tools": ["python"]}}}', "rllm.agent.agent_args.tools"),
    ('rllm.agent={"engine_args": {"retry_limit": 1}}', "rllm.agent.engine_args.retry_limit"),
    ('actor_rollout_ref.model={"path": "/etc", "lora_rank": 8}', "actor_rollout_ref.model.path"),
    ('actor_rollout_ref={"model": {"trust_remote_code": true}}', "actor_rollout_ref.model.trust_remote_code"),
    ('trainer={"python": "/bin/sh"}', "trainer.python"),
    ('trainer.python={"x": 1}', "trainer.python.x"),
    # rLLM's unified names are read as the keys they set.
    ("rllm.trainer.python=/bin/sh", "trainer.python"),
    ("rllm.trainer.default_local_dir=/home", "trainer.default_local_dir"),
    ("model.name=/etc", "actor_rollout_ref.model.path"),
    # and TRL's (AWorld's TRL configs name the model 'model').
    ("model=/etc", "actor_rollout_ref.model.path"),
    # A section given as null or empty stands for the keys under it.
    ("actor_rollout_ref.model=null", "actor_rollout_ref.model"),
    ("rllm.env={}", "rllm.env"),
]


@pytest.fixture
def member(teammate, project, registry):
    return teammate


def run_form(registry, project, overrides: str) -> dict:
    return {"agent": registry["agents"]["copy-task"].pk, "dataset": registry["datasets"]["copy"].pk,
            "reward": registry["rewards"]["char-accuracy"].pk, "backend": registry["backends"]["trl"].pk,
            "model": "tiny-char", "project": project.pk, "visibility": "team", "overrides": overrides}


def overrides_errors(response) -> str:
    assert response.status_code == 200, "a refused form re-renders the page"
    return " ".join(response.context["form"].errors.get("overrides", []))


@pytest.mark.parametrize("line,leaf", SECTION_ATTACKS)
def test_the_run_form_names_the_leaf_key_a_section_sets(page_client, member, registry, project, apply_async, line, leaf):
    response = page_client(member).post("/runs/new/", run_form(registry, project, f"{TINY_LINES}\n{line}"))
    message = overrides_errors(response)
    assert f"{leaf} " in message and "cannot be set per run" in message, message
    assert not Run.objects.exists() and not apply_async.called


def test_sections_cannot_raise_a_bound_either(page_client, member, registry, project, apply_async):
    for line in ('trainer={"total_training_steps": 1000000000}', "rllm.trainer.total_training_steps=1000000000",
                 "training.group_size=100000"):
        response = page_client(member).post("/runs/new/", run_form(registry, project, f"{TINY_LINES}\n{line}"))
        message = overrides_errors(response)
        assert "at most" in message and ("trainer.total_training_steps" in message or "actor_rollout_ref.rollout.n" in message), message
    assert not Run.objects.exists() and not apply_async.called


@pytest.mark.parametrize("overrides,leaf", [
    ({"rllm.workflow": {"workflow_args": {"reward_function": "subprocess.getoutput"}}}, "rllm.workflow.workflow_args.reward_function"),
    ({"rllm.env": {"env_args": {"reward_fn": "subprocess.getoutput"}}}, "rllm.env.env_args.reward_fn"),
    ({"+rllm.agent": {"engine_args": {"retry_limit": 1}}}, "rllm.agent.engine_args.retry_limit"),
    ({"rllm.trainer": {"python": "/bin/sh"}}, "trainer.python"),
    ({"actor_rollout_ref.model": None}, "actor_rollout_ref.model"),
])
def test_the_api_names_the_leaf_key_a_section_sets(api_client, member, project, apply_async, overrides, leaf):
    assert_refused_per_run(api_client(member), project, apply_async, overrides, leaf)


def assert_refused_per_run(client, project, apply_async, overrides: dict, key: str) -> None:
    """POST /api/runs/ with ``overrides`` is a 400 naming ``key`` as not settable per run; nothing is queued."""
    response = client.post("/api/runs/", {
        "agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl", "model": "tiny-char",
        "project": project.pk, "visibility": "team", "overrides": {**TINY, **overrides},
    }, format="json")
    assert response.status_code == 400, response.content
    message = json.dumps(response.json()["overrides"])
    assert f"{key} " in message and "cannot be set per run" in message, message
    assert not Run.objects.exists() and not apply_async.called


def test_a_sweep_space_key_is_judged_by_the_same_rule(api_client, page_client, member, make_run, project, apply_async):
    base = make_run(owner=member, project=project, visibility="team")
    body = {"name": "s", "base_run": base.pk, "sampler": "random", "max_trials": 2, "parallel": 1}
    for space, leaf in [({"rllm.env.env_args": "choice null"}, "rllm.env.env_args"),
                        ({"rllm.workflow.workflow_args": {"type": "choice", "values": [None]}}, "rllm.workflow.workflow_args"),
                        ({"actor_rollout_ref.model.path": "choice /etc"}, "actor_rollout_ref.model.path")]:
        response = api_client(member).post("/api/sweeps/", {**body, "space": space}, format="json")
        assert response.status_code == 400 and f"{leaf} cannot be set per run" in str(response.json()["space"]), response.json()
    response = page_client(member).post("/sweeps/new/", {
        "base": base.pk, "name": "s", "space": "rllm.env.env_args: choice null", "sampler": "random",
        "objective": "reward", "direction": "maximize", "max_trials": 2, "parallel": 1, "seed": 0})
    assert "rllm.env.env_args cannot be set per run" in " ".join(response.context["form"].errors["space"])
    assert not Sweep.objects.exists() and Run.objects.count() == 1 and not apply_async.called


def reported_run(api_client, member, project, overrides: dict) -> Run:
    """An external run (trained elsewhere) may record any config: it is only ever read, never run."""
    response = api_client(member).post("/api/runs/", {
        "kind": "external", "name": "notebook", "agent": "copy-task", "dataset": "copy", "reward": "char-accuracy",
        "backend": "trl", "model": "tiny-char", "project": project.pk, "visibility": "team", "overrides": overrides,
    }, format="json")
    assert response.status_code == 201, response.content
    return Run.objects.get(pk=response.json()["id"])


def test_a_sweep_from_a_run_whose_config_may_not_run_here_is_refused(api_client, member, project, apply_async):
    reported = reported_run(api_client, member, project, {**TINY, "rllm.env": {"env_args": {"reward_fn": "subprocess.getoutput"}}})
    response = api_client(member).post("/api/sweeps/", {
        "name": "s", "base_run": reported.pk, "space": {"data.train_batch_size": "choice 2"}, "sampler": "grid",
        "max_trials": 1, "parallel": 1}, format="json")
    assert response.status_code == 400 and "rllm.env.env_args.reward_fn" in str(response.json()["space"]), response.json()
    assert not Sweep.objects.exists() and Run.objects.count() == 1 and not apply_async.called


@pytest.mark.parametrize("stored", [
    {"rllm.env.env_args.reward_fn": "subprocess.getoutput"},  # an external run's config, flattened
    {"rllm.workflow": {"workflow_args": {"reward_function": "subprocess.getoutput"}}},  # a row from before the rule
])
def test_a_clone_of_such_a_run_is_refused_when_submitted(page_client, member, make_run, registry, project, apply_async, stored):
    source = make_run(owner=member, project=project, visibility="team", config_overrides={**TINY, **stored},
                      status=Run.Status.SUCCEEDED)
    client = page_client(member)
    form = client.get(f"/runs/new/?clone={source.pk}").context["form"]
    data = {key: ("" if value is None else value) for key, value in form.initial.items()}
    message = overrides_errors(client.post("/runs/new/", data))
    assert "cannot be set per run" in message and ("rllm.env.env_args.reward_fn" in message
                                                    or "rllm.workflow.workflow_args.reward_function" in message), message
    assert Run.objects.count() == 1 and not apply_async.called


def test_the_worker_drops_what_a_stored_section_would_set(make_run):
    """A row stored before the rule (or by hand) reaches the worker's merge: the section's keys are left out."""
    run = make_run(config_overrides={**TINY, "rllm.env": {"env_args": {"reward_fn": "subprocess.getoutput"}},
                                     "trainer": {"python": "/bin/sh", "total_training_steps": 3}})
    config = run_trainer_kwargs(run, run_path="")["config"]
    built = Config.build(config)
    assert built.rllm.env.env_args == {} and built.trainer.python is None
    assert built.trainer.total_training_steps == 2  # the whole section went: its other keys too, never half of it
