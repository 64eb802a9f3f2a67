"""rLLM's argument sections (rllm.agent.agent_args, rllm.env.env_args, rllm.workflow.workflow_args,
rllm.agent.engine_args) feed values into the agent's classes, and SingleTurnEnvironment imports a
reward_fn named there: a run's overrides never set them, on the form or the API."""

from __future__ import annotations

import json

import pytest

from webapp.runs.models import Run

from .test_run_files import TINY, form_errors, post_run


@pytest.mark.parametrize("key", [
    "rllm.env.env_args.reward_fn", "+rllm.env.env_args.reward_fn", "rllm.agent.agent_args.x",
    "rllm.workflow.workflow_args.reward_function", "rllm.agent.engine_args.retry_limit", "rllm.env.env_args",
])
def test_argument_sections_are_refused_per_run(owner_client, registry, key):
    value = {"reward_fn": "subprocess.getoutput"} if key == "rllm.env.env_args" else "subprocess.getoutput"
    response = post_run(owner_client, overrides={**TINY, key: value})
    assert response.status_code == 400 and key in json.dumps(response.json()["overrides"]), response.json()
    if not key.startswith("+"):  # the form's text takes key=value lines only
        errors = form_errors(owner_client, registry, overrides=f"{key}=subprocess.getoutput")
        assert key in " ".join(errors["overrides"]) and "registry entry" in " ".join(errors["overrides"])
    assert Run.objects.filter(owner__username="owner").count() == 0


def test_a_null_trajectory_timeout_is_refused_per_run(owner_client, registry):
    errors = form_errors(owner_client, registry, overrides="rllm.agent.trajectory_timeout=null")
    assert "null would mean no limit" in " ".join(errors["overrides"])
