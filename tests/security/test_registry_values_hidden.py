"""What an administrator gives an agent (its environment's arguments, a server's settings) and the
secrets it names never come back in what a member reads: the run form's and the API's errors, the
run's error, its traceback and its log lines.

The attack replayed: an administrator's environment fails and quotes its arguments (as an MCP
server's failed start quoted its command line, and a server's output its key); a member submits a
run on it and reads the error. Secrets are named in the registry (``{"$secret": NAME}``), set in
the workers' environment, and put in only where the environment is built.
"""

from __future__ import annotations

import os

import pytest

from webapp.registry.models import Agent
from webapp.runs.models import Run, RunLog
from workers.execute import claim, train_run

SECRET = "sk-live-4242-very-private"
PRIVATE_ARGUMENT = "--index=/srv/private/customer-index"

LEAKY_ENV = '''
from training import SingleTurnEnvironment


class LeakyEnv(SingleTurnEnvironment):
    """Quotes its arguments when it fails, as careless code does."""

    def __init__(self, task=None, api_key=None, server_args=(), fail_when="never"):
        super().__init__(task=task, reward_fn="exact_match")
        self.api_key, self.server_args = api_key, server_args
        if fail_when == "built" or (fail_when == "trained" and not api_key.startswith("<secret")):
            raise RuntimeError(f"cannot start the index with {server_args} and key {api_key}")

    def reset(self, task=None):
        super().reset(task)
        return {"question": str(self.task.get("prompt", ""))}, {}

    @staticmethod
    def from_dict(info):
        from training.agents.base import split_settings

        task, settings = split_settings(info, ("api_key", "server_args", "fail_when"))
        return LeakyEnv(task=task, **settings)
'''


@pytest.fixture
def leaky_agent(tmp_path, db, monkeypatch):
    tmp_path.chmod(0o755)
    (tmp_path / "leaky_env.py").write_text(LEAKY_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SEARCH_KEY", SECRET)  # set by the administrator in the workers' environment

    def make(fail_when: str) -> Agent:
        return Agent.objects.create(
            name=f"leaky-{fail_when}", agent_class="training.MathAgent", env_class="leaky_env.LeakyEnv",
            env_args={"api_key": {"$secret": "SEARCH_KEY"}, "server_args": [PRIVATE_ARGUMENT], "fail_when": fail_when},
        )
    return make


def form(registry, agent, **extra):
    return {"name": "leak", "agent": agent.pk, "dataset": registry["datasets"]["copy"].pk,
            "backend": registry["backends"]["trl"].pk, "model": "tiny-char",
            "overrides": "trainer.total_training_steps=1\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\n"
                         "data.max_response_length=4\n", **extra}


def test_a_failing_environment_does_not_show_its_arguments_in_the_form_or_the_api(owner_client, registry, leaky_agent):
    agent = leaky_agent("built")
    response = owner_client.post("/runs/new/", form(registry, agent))
    errors = " ".join(message for messages in response.context["form"].errors.values() for message in messages)
    assert "cannot start the index" in errors and "<set by the administrator>" in errors, errors
    assert PRIVATE_ARGUMENT not in errors and SECRET not in errors
    api = owner_client.post("/api/runs/", {"agent": agent.name, "dataset": "copy", "backend": "trl", "model": "tiny-char",
                                           "overrides": {"data.train_batch_size": 2}}, content_type="application/json")
    body = api.content.decode()
    assert api.status_code == 400 and "cannot start the index" in body
    assert PRIVATE_ARGUMENT not in body and SECRET not in body
    assert not Run.objects.exists()


def test_the_secret_is_put_in_only_where_the_run_trains_and_never_shown(owner_client, registry, leaky_agent, settings, tmp_path):
    agent = leaky_agent("trained")  # the check sees a placeholder and passes; the worker has the secret
    response = owner_client.post("/runs/new/", form(registry, agent))
    assert response.status_code == 302, response.context["form"].errors
    run = Run.objects.get(name="leak")
    settings.RUNS_DIR = tmp_path / "runs"
    claim(run.pk, "test-worker")
    assert train_run(run.pk) == Run.Status.FAILED
    run.refresh_from_db()
    shown = run.error + run.traceback + "".join(RunLog.objects.filter(run=run).values_list("message", flat=True))
    assert "cannot start the index" in run.error, run.error
    assert SECRET not in shown and PRIVATE_ARGUMENT not in shown, shown[-2000:]
    assert os.environ["SEARCH_KEY"] == SECRET  # it was there to be put in: the wall is what kept it out
