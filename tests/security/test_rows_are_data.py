"""A dataset row is data: it never sets a setting of the environment that plays it.

rLLM builds each environment from ``{**task, **env_args}``, and its environments pop their
settings out of that merge, so every setting an administrator left unset was the row's. The
attack replayed here: an administrator registers an agent on rLLM's ``MCPEnvironment`` with its
server's command and arguments and no environment for it; a member uploads rows that set the
server's environment to an interpreter's start-up variables that run a shell command
(``PYTHONWARNINGS`` importing ``antigravity``, which opens ``BROWSER``), and the server's command
too. It ran the command as the web user while the run form checked the run.

Now: the run's check builds no environment that starts a program (its jail refuses programs),
and the worker builds each episode's environment with the administrator's settings only; the
row's keys are fields of the task. A marker file the command would create stays absent. The same
holds for ``ToolEnvironment`` (a row asking for the ``python`` tool) and ``SingleTurnEnvironment``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from training import SingleTurnEnvironment, ToolEnvironment
from training.agents.base import build_env
from webapp.registry.models import Agent, Dataset
from webapp.runs.models import Run, RunLog
from workers.execute import claim, train_run

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "standins" / "mcp_search_server.py"
TINY = ("trainer.total_training_steps=1\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\n"
        "data.max_response_length=4\nrllm.agent.max_steps=1\n")


def attack_rows(marker: Path) -> list[dict]:
    command = f"/bin/sh -c 'touch {marker}' #%s"
    hostile = {
        "mcp_server_env": {"PYTHONWARNINGS": "all:0:antigravity.x:0:0", "BROWSER": command},
        "mcp_server_command": "/bin/sh",
        "mcp_server_args": ["-c", f"touch {marker}"],
        "tools": ["python"],
        "reward_fn": "examples.no_such_module.evil",
    }
    return [{"question": f"who wrote {name}?", "answer": name, **hostile} for name in ("Hamlet", "Faust", "Ulysses", "Emma")]


@pytest.fixture
def marker(tmp_path):
    tmp_path.chmod(0o777)  # so that a command run as any user could leave it: its absence is the wall's doing
    return tmp_path / "ran-by-the-row"


@pytest.fixture
def mcp_agent(db):
    """The administrator's agent: rLLM's ToolAgent on MCPEnvironment, the server's command and
    arguments given, its environment left unset."""
    return Agent.objects.create(
        name="search", agent_class="training.ToolAgent", env_class="training.MCPEnvironment",
        env_args={"mcp_server_command": sys.executable, "mcp_server_args": ["-P", str(STANDIN)]},  # -P: not its folder first on sys.path
    )


def upload_rows(client, project, rows: list[dict]) -> Dataset:
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    response = client.post(reverse("registry:dataset_upload", args=[project.pk]),
                           {"name": "hostile", "description": "", "file": SimpleUploadedFile("rows.jsonl", content)})
    assert response.status_code == 302, response.content.decode()[-2000:]
    mapped = client.post(response["Location"], {"prompt": "question", "ground_truth": "answer", "test_percent": 0})
    assert mapped.status_code == 302, mapped.content.decode()[-2000:]
    return Dataset.objects.get(name="hostile")


@pytest.mark.slow
def test_a_row_does_not_configure_the_mcp_server_in_the_check_or_the_worker(
        owner_client, owner, project, registry, mcp_agent, marker, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "uploads"
    dataset = upload_rows(owner_client, project, attack_rows(marker))
    response = owner_client.post("/runs/new/", {
        "name": "hostile rows", "agent": mcp_agent.pk, "dataset": dataset.pk, "backend": registry["backends"]["trl"].pk,
        "model": "tiny-char", "overrides": TINY, "project": project.pk, "visibility": "private",
    })
    assert response.status_code == 302, response.context["form"].errors
    assert not marker.exists(), "checking the run ran the row's command"

    run = Run.objects.get(name="hostile rows")
    settings.RUNS_DIR = tmp_path / "runs"
    assert claim(run.pk, "test-worker") != "skipped"
    status = train_run(run.pk)
    run.refresh_from_db()
    logs = "\n".join(RunLog.objects.filter(run=run).values_list("message", flat=True))
    assert status == Run.Status.SUCCEEDED, (run.error, logs[-3000:])
    assert not marker.exists(), "training ran the row's command"
    assert "MCP server" in logs and "started" in logs  # the administrator's server did start, per episode


def test_a_row_named_like_a_setting_stays_a_field_of_the_task():
    rows = attack_rows(Path("/nonexistent/marker"))
    env = build_env(ToolEnvironment, rows[0], {"reward_fn": "exact_match"})
    assert env.tools.tool_map == {}, "the row gave the model a python tool the administrator did not"
    assert env.task["tools"] == ["python"] and env.task["question"] == "who wrote Hamlet?"
    assert env.reward_fn.name == "exact_match"

    single = build_env(SingleTurnEnvironment, {"prompt": "2+2", "ground_truth": "4", "reward_fn": "evil.path"},
                       {"reward_fn": "exact_match"})
    assert single.reward_fn.name == "exact_match" and single.task["reward_fn"] == "evil.path"

    with pytest.raises(ValueError, match="needs a reward function"):  # the row cannot fill what the admin left out
        build_env(ToolEnvironment, {"question": "q", "reward_fn": "exact_match"}, {})


def test_the_callers_own_dict_is_still_trusted_as_rllm_scripts_build_it():
    env = ToolEnvironment.from_dict({"question": "q", "tools": [], "reward_fn": "exact_match", "max_steps": 3})
    assert env.max_steps == 3 and "tools" not in env.task
