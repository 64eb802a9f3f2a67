"""A chat agent defined in the browser without code: system prompt, model config (AWorld's names)
and tools chosen among the admin-registered ones; it becomes AWorld's agent mapping for the library,
runs through the run form and trains in the worker."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.test import Client

from training import AgentTrainer
from webapp.registry.models import Agent, Tool
from webapp.dashboard.series import keys_of
from webapp.runs.models import Run
from webapp.runs.trainer_args import trainer_kwargs
from workers.execute import claim, train_run

CHAT_OVERRIDES = {"trainer.total_training_steps": 1, "data.train_batch_size": 1, "actor_rollout_ref.rollout.n": 2,
                  "data.max_prompt_length": 1024, "data.max_response_length": 4, "rllm.agent.max_tokens_per_turn": 4,
                  "data.val_batch_size": 2}


def test_the_seeded_calculator_is_a_chat_agent_the_library_builds(registry, tmp_path):
    calculator = registry["agents"]["calculator"]
    assert calculator.kind == "chat"
    assert calculator.trainer_kwargs() == {"agent": {"agents": {"calculator": {
        "system_prompt": calculator.system_prompt, "llm_config": {"llm_temperature": 1.0},
        "tool_names": ["examples.arithmetic.add", "examples.arithmetic.multiply"],
    }}}}
    kwargs = trainer_kwargs(agent=calculator, dataset=registry["datasets"]["arithmetic"], reward=registry["rewards"]["math"],
                            backend=registry["backends"]["trl"], model="tiny-char", overrides={}, run_path=str(tmp_path))
    trainer = AgentTrainer(**kwargs)
    assert [tool.name for tool in trainer.train_processor.chat_agent.tools] == ["add", "multiply"]
    assert trainer.final_config.actor_rollout_ref.model.path == "tiny-char"


def test_an_admin_defines_a_chat_agent_and_a_member_runs_it(admin_client_, owner, registry):
    add = Tool.objects.get(name="add")
    response = admin_client_.post("/admin/registry/agent/add/", {
        "name": "adder", "description": "", "system_prompt": "Add with the tool.", "llm_config": '{"llm_temperature": 0.9}',
        "tools": [add.pk], "workflow_args": "{}", "agent_args": "{}", "env_args": "{}",
    })
    assert response.status_code == 302, response.content.decode()[:3000]
    adder = Agent.objects.get(name="adder")
    assert adder.kind == "chat" and list(adder.tools.all()) == [add]

    member = Client()
    member.force_login(owner)
    form = {"name": "adder run", "agent": adder.pk, "dataset": registry["datasets"]["arithmetic"].pk,
            "reward": registry["rewards"]["math"].pk, "backend": registry["backends"]["trl"].pk, "model": "tiny-char",
            "overrides": "\n".join(f"{k}={v}" for k, v in CHAT_OVERRIDES.items())}
    response = member.post("/runs/new/", form)
    assert response.status_code == 302, response.context["form"].errors.as_data()
    assert Run.objects.get(owner=owner).agent == adder


@pytest.mark.parametrize("fields, error", [
    ({"llm_config": '{"llm_temprature": 0.9}'}, "unknown field(s) 'llm_temprature' (did you mean 'llm_temperature'?)"),
    ({"agent_class": "examples.frozenlake.FrozenLakeAgent", "env_class": "examples.frozenlake.FrozenLakeEnv"},
     "A chat agent (system prompt, model config, tools) has no workflow or agent class."),
])
def test_the_admin_refuses_a_bad_chat_agent(admin_client_, registry, fields, error):
    data = {"name": "bad", "system_prompt": "x", "llm_config": "{}", "workflow_args": "{}", "agent_args": "{}",
            "env_args": "{}", **fields}
    response = admin_client_.post("/admin/registry/agent/add/", data)
    assert response.status_code == 200 and error in response.content.decode().replace("&#x27;", "'")
    assert not Agent.objects.filter(name="bad").exists()


def test_a_tool_that_the_model_could_not_read_is_refused(admin_client_, db):
    response = admin_client_.post("/admin/registry/tool/add/", {"name": "bad", "path": "examples.arithmetic.make_arithmetic_tasks"})
    assert response.status_code == 200 and "docstring" in response.content.decode()
    assert not Tool.objects.exists()


def test_the_api_shows_a_chat_agents_fields(owner_client, registry):
    agents = {a["name"]: a for a in owner_client.get("/api/agents/").json()["results"]}
    assert agents["calculator"]["kind"] == "chat" and agents["calculator"]["tools"] == ["add", "multiply"]
    assert agents["calculator"]["llm_config"] == {"llm_temperature": 1.0}


# The recorder writes from its own thread and connection: the rows must be committed.
@pytest.mark.django_db(transaction=True)
def test_a_chat_agent_run_trains_in_the_worker(make_run, registry, tmp_path, settings):
    settings.RUNS_DIR = tmp_path
    adder = Agent.objects.create(name="adder", system_prompt="Add.", llm_config={"llm_temperature": 0.9})
    adder.tools.set([Tool.objects.get(name="add")])
    run = make_run(agent=adder, dataset=registry["datasets"]["arithmetic"], reward=registry["rewards"]["math"],
                   config_overrides=CHAT_OVERRIDES)
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.traceback
    assert run.steps == 1 and run.final_config["actor_rollout_ref"]["rollout"]["temperature"] == 0.9  # the agent's
    written = yaml.safe_load((Path(run.run_path) / "config.yaml").read_text())
    assert written["agent"] == {"kind": "chat", "name": "adder", "system_prompt": "Add.",
                                "tool_names": ["examples.arithmetic.add"], "llm_config": {"llm_temperature": 0.9}}
    keys = set(keys_of(run.pk))
    assert {"reward", "val/arithmetic-add/reward", "val/arithmetic-add/pass@1"} <= keys
