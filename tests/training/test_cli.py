"""The command line, as a user runs it: a real subprocess for a training run, a failed one and a
refused key; the other refusals call the same ``main`` in this process (a fresh interpreter imports
the whole library, seconds each, and they are not about the process)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.backends.processor import available_processors
from training.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture
def cli_in_process(capsys, monkeypatch):
    """``main`` as ``python -m training`` calls it, from the repository root: its exit code and what it
    wrote, in the shape of ``subprocess.run``'s answer."""
    monkeypatch.chdir(ROOT)

    def run(*args):
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["python", "-m", "training", *args], code, out, err)

    return run


@pytest.mark.slow
def test_train_from_a_run_file(tmp_path):
    result = run_cli("train", "examples/configs/copy.yaml", "--run-path", str(tmp_path),
                     "--set", "trainer.total_training_steps=2", "--set", "data.train_batch_size=2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "step 2/2 reward=" in result.stderr + result.stdout  # the one-line summary per log step
    lines = result.stdout.strip().splitlines()
    last_step = max(i for i, line in enumerate(lines) if line.startswith("step "))
    finished = lines[last_step + 1]  # the summary right after the last step's line (then warnings, if any)
    assert lines[last_step].startswith("step 2/2 reward="), result.stdout
    assert finished.startswith("training finished: 2 steps, status succeeded") and str(tmp_path) in finished
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [0, 1, 2]  # step 0: the test split, scored before training
    assert "val/copy/reward" in records[0] and "reward" in records[1]


def test_bad_key_is_reported_without_a_traceback():
    result = run_cli("train", "examples/configs/copy.yaml", "--set", "data.train_batchsize=2")
    assert result.returncode == 2
    assert "error: data.train_batchsize: unknown config key. Did you mean 'data.train_batch_size'?" in result.stderr
    assert "Traceback" not in result.stderr
    assert "step/s]" not in result.stderr  # no empty progress bar ("0/100 [00:00<?, ?step/s]") above the error


@pytest.mark.slow
def test_every_episode_raising_exits_non_zero_with_the_count_and_the_agents_traceback(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        "agent:\n  agent_class: tests/fixtures/misported_agent.py:MisportedAgent\n"
        "  env_class: examples.frozenlake.FrozenLakeEnv\n"
        "train_dataset: frozenlake:train\nbackend: trl\n"
        "config:\n  actor_rollout_ref.model.path: tiny-char\n  actor_rollout_ref.rollout.n: 2\n"
        "  data.train_batch_size: 2\n  rllm.agent.max_tokens_per_turn: 1\n  trainer.total_training_steps: 2\n"
    )
    result = run_cli("train", str(run_file), "--run-path", str(tmp_path / "run"))
    assert result.returncode == 1, result.stderr[-2000:]
    assert "error: the run failed: 4 of 4 episodes in step 1 ended with an error" in result.stderr
    assert "unexpected keyword argument 'confidence_score'" in result.stderr
    assert 'misported_agent.py", line' in result.stderr  # the agent's own traceback ...
    assert "site-packages" not in result.stderr  # ... and none of the library's or TRL's frames
    assert "training finished" not in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "training failed: 0 of 2 steps, status failed (the error above says why)"


def test_header_only_csv_is_refused_before_training(tmp_path, cli_in_process):
    path = tmp_path / "tasks.csv"
    path.write_text("prompt,ground_truth\n")
    run_file = tmp_path / "run.yaml"
    run_file.write_text(f"train_dataset: {path}\nreward_func: exact_match\nbackend: trl\n")
    result = cli_in_process("train", str(run_file))
    assert result.returncode == 2
    assert result.stderr.strip().endswith(f"error: train_dataset: cannot use {path}: it has a header (prompt, ground_truth) but no rows.")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_run_that_learnt_nothing_succeeds_and_says_so_last(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(  # the untrained model never writes the copy task's answer exactly: reward 0 throughout
        "train_dataset: copy:train\nreward_func: exact_match\nbackend: trl\n"
        "config:\n  actor_rollout_ref.model.path: tiny-char\n  actor_rollout_ref.rollout.n: 2\n"
        "  data.train_batch_size: 2\n  data.max_response_length: 4\n  trainer.total_training_steps: 2\n"
    )
    result = run_cli("train", str(run_file), "--run-path", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]  # a warning is not a failure
    *_, done, warning = result.stdout.strip().splitlines()
    assert done.startswith("training finished: 2 steps, status succeeded, but it learnt nothing (1 warning below); ")
    assert warning.startswith("warning: reward was 0 at every step (steps 1 to 2)") and "exact_match" in warning


def test_a_misspelt_agent_class_is_answered_with_what_its_module_defines(tmp_path, cli_in_process):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("agent:\n  agent_class: examples.frozenlake.FrozenLakeAgnt\n  env_class: examples.frozenlake.FrozenLakeEnv\n"
                        "train_dataset: frozenlake:train\nbackend: trl\nconfig:\n  actor_rollout_ref.model.path: tiny-char\n")
    result = cli_in_process("train", str(run_file), "--run-path", str(tmp_path / "run"))
    assert result.returncode == 2
    assert ("module has no attribute 'FrozenLakeAgnt'. Did you mean 'FrozenLakeAgent'? It defines: FrozenLakeAgent, "
            "FrozenLakeEnv, goal_distances, make_tasks.") in result.stderr
    assert "Traceback" not in result.stderr and "training finished" not in result.stdout


def test_a_wrong_backend_reward_or_dataset_name_lists_the_valid_ones(tmp_path, cli_in_process):
    cases = {
        # Every registered backend (a stand-in another test registered in this process included).
        "backend: trll": f"Unknown training backend 'trll'; known backends: {', '.join(available_processors())}.",
        "reward_func: exact_mach": "unknown reward 'exact_mach': built-in rewards are char_accuracy, code, countdown,",
        "train_dataset: copy:trian": "dataset 'copy' has no split 'trian'; available splits: train, test.",
    }
    for change, message in cases.items():
        key = change.split(":")[0]
        lines = [line for line in (ROOT / "examples/configs/copy.yaml").read_text().splitlines() if not line.startswith(f"{key}:")]
        run_file = tmp_path / "run.yaml"
        run_file.write_text("\n".join([*lines, change]) + "\n")
        result = cli_in_process("train", str(run_file), "--run-path", str(tmp_path / "run"))
        assert result.returncode == 2 and message in result.stderr, (change, result.stderr[-1000:])
