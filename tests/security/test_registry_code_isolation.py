"""The web process never imports or calls registry code (agents, environments, workflows, rewards,
tools): checking a run happens in a child process in the jail (training/isolation/jail.py: a mount namespace
as an unprivileged uid, no network, no secret in its environment, no new program), and its errors
still come back next to the form's fields and in the API's 400 body.

The admin-registered code here tries what an attacker's reward would -- leave a file on the host,
start a program, read the platform's secret key, reach the database's port, read the environment --
and tells what it found in the error it raises, so the test reads it from the form.
"""

from __future__ import annotations

import json

import pytest

from webapp.registry.models import Agent, Dataset, Model, RewardFunction, Tool
from webapp.runs.models import Run

TINY = "trainer.total_training_steps=2\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\ndata.max_response_length=4\n"


PROBE = """
import json, os, socket, subprocess
def _findings():
    found = {"pid": os.getpid(), "uid": os.getuid(), "environ": sorted(os.environ)}
    try:
        open(MARKER, "a").write("here")
        found["marker"] = "written"
    except OSError as exc:
        found["marker"] = type(exc).__name__
    try:
        subprocess.run(["true"])
        found["program"] = "started"
    except OSError as exc:
        found["program"] = exc.strerror
    try:
        found["secret"] = open(SECRET).read()
    except OSError as exc:
        found["secret"] = type(exc).__name__
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
        found["database"] = "reached"
    except OSError as exc:
        found["database"] = type(exc).__name__
    return found
"""


@pytest.fixture
def evil_reward(tmp_path, db, settings):
    tmp_path.chmod(0o755)  # an admin's code folder: readable by all, as /srv/rewards would be
    marker = tmp_path / "marker"
    path = tmp_path / "evil_reward.py"
    path.write_text(
        f"MARKER = {str(marker)!r}\nSECRET = {str(settings.VAR_DIR / 'secret_key')!r}\n" + PROBE +
        "IMPORTED = _findings()\n"
        "def score(completion, ground_truth, **kwargs):\n"
        "    raise RuntimeError('findings ' + json.dumps({'import': IMPORTED, 'call': _findings()}))\n"
    )
    return RewardFunction.objects.create(name="evil", path=f"{path}:score"), marker


def findings(errors: dict) -> dict:
    """What the reward found, from the errors of a form (field -> messages) or an API 400 body."""
    text = " ".join(str(message) for messages in errors.values() for message in messages)
    assert "findings " in text, text
    return json.JSONDecoder().raw_decode(text.split("findings ", 1)[1])[0]


def form_data(registry, **fields):
    data = {"agent": registry["agents"]["copy-task"].pk, "dataset": registry["datasets"]["copy"].pk,
            "reward": registry["rewards"]["char-accuracy"].pk, "backend": registry["backends"]["trl"].pk,
            "model": "tiny-char", "overrides": TINY}
    data.update(fields)
    return data


def test_a_reward_is_imported_and_called_in_the_jail(owner_client, registry, evil_reward, settings, no_queue):
    import os

    reward, marker = evil_reward
    response = owner_client.post("/runs/new/", form_data(registry, reward=reward.pk))
    assert response.status_code == 200
    seen = findings(response.context["form"].errors)
    for moment in ("import", "call"):
        found = seen[moment]
        assert found["pid"] != os.getpid(), "registry code ran in the web process"
        assert found["uid"] != 0, "registry code ran as root"
        assert found["marker"] != "written" and not marker.exists(), "registry code wrote on the host"
        assert found["program"] == "Operation not permitted", found
        assert found["secret"] == "FileNotFoundError", "the platform's secret key is in the jail"
        assert found["database"] != "reached", found
        inherited = set(found["environ"]) & set(os.environ)  # the web process's own variables (DATABASE_URL, ...)
        assert "DATABASE_URL" in os.environ and inherited <= {"PATH", "LANG", "HOME", "PYTHONPATH", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
                                         "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "HF_HUB_OFFLINE",
                                         "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "PWD",
                             "TORCHINDUCTOR_CACHE_DIR"}, inherited  # the last two: set by the shell and by torch itself
    assert not Run.objects.exists()
    api = owner_client.post("/api/runs/", {"agent": "copy-task", "dataset": "copy", "reward": "evil", "backend": "trl",
                                           "model": "tiny-char", "overrides": {"data.train_batch_size": 2}},
                            content_type="application/json")
    assert api.status_code == 400 and findings(api.json())["call"]["uid"] != 0
    assert not marker.exists() and not Run.objects.exists()


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


@pytest.mark.slow
def test_a_hanging_reward_is_stopped_at_the_time_limit(owner_client, registry, tmp_path, settings, no_queue):
    settings.RUN_CHECK_TIMEOUT_SECONDS = 2
    tmp_path.chmod(0o755)
    path = tmp_path / "slow.py"
    path.write_text("import time\ndef score(completion, ground_truth, **kwargs):\n    time.sleep(60)\n    return 0.0\n")
    slow = RewardFunction.objects.create(name="slow", path=f"{path}:score")
    response = owner_client.post("/runs/new/", form_data(registry, reward=slow.pk))
    assert "took over 2 s" in " ".join(response.context["form"].non_field_errors())
    assert not Run.objects.exists()


@pytest.mark.slow
def test_a_memory_hungry_reward_is_stopped_at_the_memory_limit(owner_client, registry, tmp_path, settings, no_queue):
    settings.RUN_CHECK_MEMORY_MB = 256
    tmp_path.chmod(0o755)
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


def test_an_admins_tool_is_loaded_in_the_jail(admin_client_, tmp_path, monkeypatch):
    import sys

    tmp_path.chmod(0o755)
    marker = tmp_path / "tool-marker"
    (tmp_path / "evil_tool.py").write_text(
        "try:\n"
        f"    open({str(marker)!r}, 'a').write('imported')\n"
        "except OSError:\n    pass\n"
        "def shout(text: str) -> str:\n    \"\"\"Shout.\n\n    Args:\n        text: what to shout.\n    \"\"\"\n    return text.upper()\n"
    )
    (tmp_path / "broken_tool.py").write_text("raise RuntimeError('imported in the check')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    Tool(name="shout", path="evil_tool.shout").full_clean()
    assert "evil_tool" not in sys.modules and not marker.exists(), "the tool ran in the web process or wrote on the host"
    with pytest.raises(Exception, match="imported in the check"):  # it is imported, just not here
        Tool(name="broken", path="broken_tool.fn").full_clean()
    with pytest.raises(Exception, match="no_such_tool_module"):
        Tool(name="nope", path="no_such_tool_module.fn").full_clean()


def test_a_check_sees_its_own_registry_code_and_not_the_code_an_earlier_check_used(owner_client, registry, tmp_path,
                                                                                     no_queue):
    """The checking server's jail shows the registry code folders of the check at hand (it starts
    again when a check names a folder it does not show): a second admin's reward cannot read the
    first's, and the first's sibling module imports."""
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (tmp_path, first, second):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)
    (first / "helpers.py").write_text("WEIGHT = 3\n")
    (first / "reward.py").write_text(
        "import sys, os\nsys.path.insert(0, os.path.dirname(__file__))\nfrom helpers import WEIGHT\n"
        "def score(completion, ground_truth, **kwargs):\n    return float(WEIGHT > 2)\n")
    (second / "reward.py").write_text(
        "import json\n"
        f"FIRST = {str(first / 'helpers.py')!r}\n"
        "def score(completion, ground_truth, **kwargs):\n"
        "    try:\n        seen = open(FIRST).read()\n    except OSError as exc:\n        seen = type(exc).__name__\n"
        "    raise RuntimeError('findings ' + json.dumps({'first': seen, 'file': __file__}))\n")
    first_reward = RewardFunction.objects.create(name="first", path=f"{first / 'reward.py'}:score")
    second_reward = RewardFunction.objects.create(name="second", path=f"{second / 'reward.py'}:score")

    response = owner_client.post("/runs/new/", form_data(registry, reward=first_reward.pk))
    assert response.status_code == 302, response.context["form"].errors  # its sibling module imported in the jail
    response = owner_client.post("/runs/new/", form_data(registry, reward=second_reward.pk))
    seen = findings(response.context["form"].errors)
    assert seen["first"] == "FileNotFoundError", "a check saw the registry code of an earlier one"
    assert seen["file"] == str(second / "reward.py"), seen  # loaded from where the admin put it
