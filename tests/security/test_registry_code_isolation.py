"""The web process never imports or calls registry code (agents, environments, workflows, rewards,
tools): checking a run happens in a sandboxed child process, and its errors still come back next to
the form's fields and in the API's 400 body.

The admin-registered code here records the PID of the process that imported it and of the one that
called it, and starts a subprocess when called, as an attacker's reward would.
"""

from __future__ import annotations

import json

import pytest

from webapp.registry.models import Agent, Dataset, Model, RewardFunction, Tool
from webapp.runs.models import Run

TINY = "trainer.total_training_steps=2\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\ndata.max_response_length=4\n"


@pytest.fixture
def evil_reward(tmp_path, db):
    marker = tmp_path / "marker"
    path = tmp_path / "evil_reward.py"
    path.write_text(
        "import os, subprocess\n"
        f"MARKER = {str(marker)!r}\n"
        "open(MARKER, 'a').write(f'import {os.getpid()}\\n')\n"
        "def score(completion, ground_truth, **kwargs):\n"
        "    subprocess.run(['true'])\n"
        "    open(MARKER, 'a').write(f'call {os.getpid()}\\n')\n"
        "    return 0.0\n"
    )
    return RewardFunction.objects.create(name="evil", path=f"{path}:score"), marker


def pids(marker) -> dict[str, set[int]]:
    seen: dict[str, set[int]] = {"import": set(), "call": set()}
    for line in marker.read_text().splitlines() if marker.exists() else []:
        what, pid = line.split()
        seen[what].add(int(pid))
    return seen


def form_data(registry, **fields):
    data = {"agent": registry["agents"]["copy-task"].pk, "dataset": registry["datasets"]["copy"].pk,
            "reward": registry["rewards"]["char-accuracy"].pk, "backend": registry["backends"]["trl"].pk,
            "model": "tiny-char", "overrides": TINY}
    data.update(fields)
    return data


def test_a_reward_is_imported_and_called_outside_the_web_process(owner_client, registry, evil_reward, no_queue):
    import os

    reward, marker = evil_reward
    response = owner_client.post("/runs/new/", form_data(registry, reward=reward.pk))
    assert response.status_code == 302, response.context["form"].errors
    seen = pids(marker)
    assert seen["import"] and seen["call"], "the check imports and calls the reward (in its sandbox)"
    assert os.getpid() not in seen["import"] | seen["call"], "registry code ran in the web process"
    api = owner_client.post("/api/runs/", {"agent": "copy-task", "dataset": "copy", "reward": "evil", "backend": "trl",
                                           "model": "tiny-char", "overrides": {"data.train_batch_size": 2}},
                            content_type="application/json")
    assert api.status_code == 201, api.json()
    assert os.getpid() not in pids(marker)["import"] | pids(marker)["call"]


def test_errors_from_the_sandbox_land_next_to_their_fields(owner_client, registry, no_queue):
    broken = Agent.objects.create(name="broken", workflow_class="no_such_module.Workflow")
    response = owner_client.post("/runs/new/", form_data(registry, agent=broken.pk))
    assert "no_such_module" in " ".join(response.context["form"].errors["agent"])
    response = owner_client.post("/runs/new/", form_data(registry, overrides="data.train_batch_size=0"))
    assert "data.train_batch_size" in " ".join(response.context["form"].errors["overrides"])
    api = owner_client.post("/api/runs/", {"agent": "broken", "dataset": "copy", "reward": "char-accuracy", "backend": "trl",
                                           "model": "tiny-char"}, content_type="application/json")
    assert api.status_code == 400 and "no_such_module" in json.dumps(api.json()["agent"])
    assert not Run.objects.exists()


def test_a_hanging_reward_is_stopped_at_the_time_limit(owner_client, registry, tmp_path, settings, no_queue):
    settings.RUN_CHECK_TIMEOUT_SECONDS = 2
    path = tmp_path / "slow.py"
    path.write_text("import time\ndef score(completion, ground_truth, **kwargs):\n    time.sleep(60)\n    return 0.0\n")
    slow = RewardFunction.objects.create(name="slow", path=f"{path}:score")
    response = owner_client.post("/runs/new/", form_data(registry, reward=slow.pk))
    assert "took over 2 s" in " ".join(response.context["form"].non_field_errors())
    assert not Run.objects.exists()


def test_a_memory_hungry_reward_is_stopped_at_the_memory_limit(owner_client, registry, tmp_path, settings, no_queue):
    settings.RUN_CHECK_MEMORY_MB = 256
    path = tmp_path / "hungry.py"
    path.write_text("def score(completion, ground_truth, **kwargs):\n    hog = bytearray(2 * 1024 ** 3)\n    return 0.0\n")
    hungry = RewardFunction.objects.create(name="hungry", path=f"{path}:score")
    response = owner_client.post("/runs/new/", form_data(registry, reward=hungry.pk))
    errors = json.dumps(response.context["form"].errors)
    assert "MemoryError" in errors or "memory" in errors, errors
    assert not Run.objects.exists()


def test_a_model_not_on_this_machine_is_refused_at_once_by_name(owner_client, registry, no_queue):
    Model.objects.create(name="missing", source=Model.Source.HUB, identifier="nobody-here/no-such-model")
    response = owner_client.post("/runs/new/", form_data(registry, model="missing"))
    message = " ".join(response.context["form"].errors["model"])
    assert "nobody-here/no-such-model" in message and "downloaded" in message
    assert not Run.objects.exists()


def test_an_empty_model_is_refused(owner_client, registry, no_queue):
    response = owner_client.post("/runs/new/", form_data(registry, model=""))
    assert "model" in response.context["form"].errors and not Run.objects.exists()


def test_an_agent_on_a_dataset_without_its_fields_is_refused_naming_them(owner_client, registry, no_queue):
    response = owner_client.post("/runs/new/", form_data(
        registry, agent=registry["agents"]["frozenlake"].pk, reward="", dataset=registry["datasets"]["copy"].pk))
    errors = response.context["form"].errors
    message = " ".join(errors.get("agent", []) + errors.get("dataset", []))
    assert "copy" in message and "needs" in message, message
    assert not Run.objects.exists()


def test_an_admins_tool_is_loaded_outside_the_web_process(admin_client_, tmp_path, monkeypatch):
    import os
    import sys

    marker = tmp_path / "tool-marker"
    (tmp_path / "evil_tool.py").write_text(
        "import os\n"
        f"open({str(marker)!r}, 'a').write(f'import {{os.getpid()}}\\n')\n"
        "def shout(text: str) -> str:\n    \"\"\"Shout.\n\n    Args:\n        text: what to shout.\n    \"\"\"\n    return text.upper()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "evil_tool" not in sys.modules
    tool = Tool(name="shout", path="evil_tool.shout")
    tool.full_clean()
    assert pids(marker)["import"] and os.getpid() not in pids(marker)["import"]
    with pytest.raises(Exception, match="no_such_tool_module"):
        Tool(name="nope", path="no_such_tool_module.fn").full_clean()
