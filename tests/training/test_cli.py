"""The command line, as a user runs it: a real subprocess."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_train_from_a_run_file(tmp_path):
    result = run_cli("train", "examples/configs/copy.yaml", "--run-path", str(tmp_path),
                     "--set", "trainer.total_training_steps=2", "--set", "data.train_batch_size=2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "done: 2 steps" in result.stdout and str(tmp_path) in result.stdout
    assert "step 2/2 reward=" in result.stderr + result.stdout  # the one-line summary per log step
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_bad_key_is_reported_without_a_traceback():
    result = run_cli("train", "examples/configs/copy.yaml", "--set", "data.train_batchsize=2")
    assert result.returncode == 2
    assert "error: data.train_batchsize: unknown config key. Did you mean 'data.train_batch_size'?" in result.stderr
    assert "Traceback" not in result.stderr
