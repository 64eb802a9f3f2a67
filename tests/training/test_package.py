"""The library as a package: the wheel built from pyproject.toml installs into a fresh virtual
environment, and its ``agent-trainer`` command trains the copy task from a directory that has
nothing to do with this checkout.

No downloads: the wheel is built without build isolation, installed with ``--no-deps --no-index``,
and the new environment sees this environment's packages (torch, TRL, ...) through a ``.pth`` file,
so only the wheel's own code is new there."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

RUN_FILE = """\
train_dataset: copy:train
reward_func: char_accuracy
backend: trl
run_path: out/copy
config:
  actor_rollout_ref.model.path: tiny-char
  actor_rollout_ref.actor.optim.lr: 0.001
  actor_rollout_ref.rollout.n: 4
  data.train_batch_size: 4
  data.max_response_length: 4
  trainer.total_training_steps: 3
  trainer.cpu_threads: 1
"""


def _run(command: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed; returns its bin/ folder."""
    work = tmp_path_factory.mktemp("package")
    source = work / "source"  # a clean copy: the build leaves nothing behind in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("training", "examples"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", work / "dist", source], work)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next((work / "dist").glob("agent_trainer-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "training/trainer.py" in names and "examples/configs/frozenlake.yaml" in names

    venv = work / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], work)
    assert made.returncode == 0, made.stderr
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "shared-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index", wheel], work)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv / "bin"


def test_the_installed_command_trains_the_copy_task_from_an_unrelated_directory(installed, tmp_path):
    where = _run([installed / "python", "-c", "import training, examples; print(training.__file__); print(examples.__file__)"], tmp_path)
    assert where.returncode == 0 and all(str(installed.parent) in line for line in where.stdout.split()), where.stdout + where.stderr

    (tmp_path / "copy.yaml").write_text(RUN_FILE)
    trained = _run([installed / "agent-trainer", "train", "copy.yaml"], tmp_path, timeout=600)
    assert trained.returncode == 0, trained.stdout + trained.stderr[-3000:]
    assert "training finished: 3 steps, status succeeded" in trained.stdout
    run_dir = tmp_path / "out" / "copy"
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "reward" in s] == [1, 2, 3]
    assert (run_dir / "final_model" / "config.json").exists()


def test_the_platform_command_is_installed_and_explains_itself(installed, tmp_path):
    helped = _run([installed / "agent-trainer-platform", "--help"], tmp_path)
    assert helped.returncode == 0 and all(c in helped.stdout for c in ("login", "create", "list", "follow", "cancel"))
    missing = _run([installed / "agent-trainer-platform", "--url", "http://127.0.0.1:9", "--token", "t", "list"], tmp_path)
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr
