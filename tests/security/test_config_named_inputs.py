"""A member's config names no file on the workers: verl's keys that name a run's inputs by path
(``data.train_files``, ``data.val_files``, ``custom_reward_function.path``/``name``, also under verl's
newer ``reward.`` section and rLLM's ``rllm.data.``), which the library reads as AWorld's
``AgentTrainer`` does, are refused wherever a member's config comes in, naming the registry field
that chooses them instead; a row stored before the rule reaches the worker without them, and the
Python file it named never runs.
"""

from __future__ import annotations

import json

import pytest
import yaml

from webapp.runs.models import Run
from webapp.runs.trainer_args import run_trainer_kwargs

from .test_override_sections import TINY_LINES, assert_refused_per_run, member, overrides_errors, run_form  # noqa: F401 (member: a fixture)
from .test_run_files import TINY, roots  # noqa: F401 (roots: a fixture)
from workers.execute import claim, train_run

# (override line as typed, the key the refusal names, the registry field it points to)
INPUT_KEYS = [
    ("data.train_files=/etc/passwd.parquet", "data.train_files", "Dataset field"),
    ("data.val_files=[/srv/other/test.parquet]", "data.val_files", "dataset's entry"),
    ("custom_reward_function.path=/tmp/evil.py", "custom_reward_function.path", "Reward field"),
    ("custom_reward_function.name=compute_score", "custom_reward_function.name", "Reward field"),
    ("reward.custom_reward_function.path=/tmp/evil.py", "reward.custom_reward_function.path", "Reward field"),
    ('custom_reward_function={"path": "/tmp/evil.py", "name": "f"}', "custom_reward_function.path", "Reward field"),
    ("rllm.data.train_files=/etc/passwd.parquet", "data.train_files", "Dataset field"),
    ('data={"train_files": "/etc/passwd.parquet"}', "data.train_files", "Dataset field"),
]


@pytest.mark.parametrize("line,key,field", INPUT_KEYS)
def test_the_run_form_refuses_a_config_that_names_an_input(page_client, member, registry, project, apply_async, line, key, field):
    response = page_client(member).post("/runs/new/", run_form(registry, project, f"{TINY_LINES}\n{line}"))
    message = overrides_errors(response)
    assert f"{key} " in message and "cannot be set per run" in message and field in message, message
    assert not Run.objects.exists() and not apply_async.called


@pytest.mark.parametrize("overrides,key", [
    ({"data.train_files": ["/etc/passwd.parquet"]}, "data.train_files"),
    ({"custom_reward_function": {"path": "/tmp/evil.py"}}, "custom_reward_function.path"),
    ({"+reward.custom_reward_function.name": "f"}, "reward.custom_reward_function.name"),
])
def test_the_api_refuses_a_config_that_names_an_input(api_client, member, project, apply_async, overrides, key):
    assert_refused_per_run(api_client(member), project, apply_async, overrides, key)


@pytest.mark.django_db(transaction=True)
def test_a_stored_row_reaches_the_worker_without_them_and_the_file_never_runs(roots, make_run, tmp_path):
    """A row stored before the rule (or by hand) names an evil reward file and another data file: the
    worker's merge leaves the keys out, the run trains on the registry's dataset and reward, and the
    evil file is never imported."""
    marker = tmp_path / "evil-ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef compute_score(*args, **kwargs):\n    return 1.0\n")
    data = tmp_path / "other.jsonl"
    data.write_text(json.dumps({"prompt": "secret", "ground_truth": "x"}) + "\n")
    run = make_run(config_overrides={**TINY, "trainer.total_training_steps": 1, "data.train_files": str(data),
                                     "custom_reward_function.path": str(evil),
                                     "custom_reward_function": {"name": "compute_score"}})
    config = run_trainer_kwargs(run, run_path="")["config"]
    assert not [key for key in config if "train_files" in key or "custom_reward_function" in key]
    claim(run.pk, "w")
    assert train_run(run.pk) == Run.Status.SUCCEEDED, Run.objects.get(pk=run.pk).error
    run.refresh_from_db()
    written = yaml.safe_load((run.folder() / "config.yaml").read_text())
    assert written["reward"] not in (None, "compute_score")  # the registry's reward scored it
    assert not marker.exists(), "the reward file the config named ran"
