"""trainer.logger's external trackers (W&B and SwanLab offline, TensorBoard, MLflow), read back with each tool's
own reader, through the command line as a user runs it; the system metrics on a CPU run."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import wandb_records
from training.config import Config
from training.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def train_copy(run_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TENSORBOARD_", "SWANLAB_"))}
    args = ["train", "examples/configs/copy.yaml", "--run-path", str(run_path),
            "--set", "data.train_batch_size=2", "--set", "actor_rollout_ref.rollout.n=4",
            "--set", "trainer.val_before_train=false", "--set", "trainer.system_metrics_interval=0.2"]
    for item in overrides:
        args += ["--set", item]
    result = subprocess.run([sys.executable, "-m", "training", *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def ours(run_path: Path, name: str) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_path / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row[name] for row in rows if row.get(name) is not None}


def tensorboard_series(run_path: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_path / "tensorboard"))
    accumulator.Reload()
    return {event.step: event.value for event in accumulator.Scalars(tag)}


def mlflow_client(run_path: Path):
    from mlflow import MlflowClient

    ids = json.loads((run_path / "trackers.json").read_text())["mlflow"]
    assert ids["uri"] == f"sqlite:///{(run_path / 'mlruns' / 'mlflow.db').resolve()}"
    return MlflowClient(ids["uri"]), ids["run_id"]


def wandb_files(run_path: Path) -> list[Path]:
    return sorted(run_path.glob("wandb/offline-run-*/run-*.wandb"))


def swanlab_series(run_path: Path, key: str) -> dict[int, float]:
    """Every offline SwanLab run file under the run folder, read with SwanLab's own record reader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    series: dict[int, float] = {}
    for path in sorted(run_path.glob("swanlog/run-*/run-*.swanlab")):
        reader = DataStoreReader()
        reader.open(path)
        while (data := reader.scan()) is not None:
            record = Record()
            record.ParseFromString(data)
            if record.HasField("scalar") and record.scalar.key == key:
                series[record.scalar.step] = record.scalar.value.number
        reader.close()
    return series


@pytest.mark.slow
def test_each_tracker_holds_our_reward_series_step_for_step_and_a_resume_continues_the_same_runs(tmp_path):
    run_path = tmp_path / "run"
    result = train_copy(run_path, "trainer.logger=[console,jsonl,tensorboard,mlflow,wandb,swanlab]",
                        "trainer.total_training_steps=3", "trainer.experiment_name=copy-tracked")
    reward = ours(run_path, "reward")
    assert sorted(reward) == [1, 2, 3]
    assert "step 3/3 reward=" in result.stdout + result.stderr  # console shown by the progress bar

    # TensorBoard, through its EventAccumulator: scalars per step and the config as text.
    assert tensorboard_series(run_path, "reward") == pytest.approx(reward)

    # MLflow, through MlflowClient on the SQLite store in the run folder.
    client, run_id = mlflow_client(run_path)
    run = client.get_run(run_id)
    assert run.info.run_name == "copy-tracked" and run.info.status == "FINISHED"
    assert run.data.params["data.train_batch_size"] == "2" and run.data.params["trainer.logger"].startswith("[")
    history = {m.step: m.value for m in client.get_metric_history(run_id, "reward")}
    assert history == pytest.approx(reward)
    assert client.list_artifacts(run_id, "episodes")  # sampled episodes as JSON per step

    # W&B, offline: the run file wandb sync would upload.
    [wandb_file] = wandb_files(run_path)
    rows = wandb_records.history(wandb_file)
    assert {row["_step"]: row["reward"] for row in rows if "reward" in row} == pytest.approx(reward)
    assert any(row.get("episodes/_type") == "table-file" for row in rows)  # the sampled conversations table
    assert wandb_records.config(wandb_file)["trainer.experiment_name"] == "copy-tracked"

    # SwanLab, offline: the run file swanlab sync would upload.
    assert swanlab_series(run_path, "reward") == pytest.approx(reward)

    # System metrics: sampled in the training process, on our steps and in every tracker.
    cpu = ours(run_path, "system/cpu/machine")
    # A step faster than the sampling interval carries no reading (never one reading twice).
    assert cpu and set(cpu) <= {1, 2, 3} and all(0 <= v <= 100 for v in cpu.values())
    assert all(v > 0.05 for v in ours(run_path, "system/memory_gb/process").values())  # torch alone is more
    assert sorted(tensorboard_series(run_path, "system/memory_gb/machine")) == sorted(cpu)

    # Resume from the step-3 checkpoint to step 5: the same MLflow run and W&B id go on.
    ids_before = json.loads((run_path / "trackers.json").read_text())
    train_copy(run_path, "trainer.logger=[jsonl,tensorboard,mlflow,wandb,swanlab]", "trainer.total_training_steps=5",
               "trainer.experiment_name=copy-tracked")
    ids_after = json.loads((run_path / "trackers.json").read_text())
    assert ids_after["mlflow"]["run_id"] == ids_before["mlflow"]["run_id"]
    assert ids_after["wandb"]["id"] == ids_before["wandb"]["id"]
    reward = ours(run_path, "reward")
    assert sorted(reward) == [1, 2, 3, 4, 5]
    assert {m.step: m.value for m in client.get_metric_history(run_id, "reward")} == pytest.approx(reward)
    assert tensorboard_series(run_path, "reward") == pytest.approx(reward)
    files = wandb_files(run_path)
    assert {path.name for path in files} == {f"run-{ids_before['wandb']['id']}.wandb"}
    steps = [row["_step"] for path in files for row in wandb_records.history(path) if "reward" in row]
    assert sorted(set(steps)) == [1, 2, 3, 4, 5]
    # SwanLab resumes only online: offline, the resumed steps go to a second local run file.
    assert swanlab_series(run_path, "reward") == pytest.approx(reward)


def test_cli_keeps_the_users_loggers_and_only_moves_console_to_the_progress_bar(tmp_path):
    from training.cli import without_console_logger

    assert without_console_logger({"trainer": {"logger": ["console", "wandb"]}})["trainer.logger"] == ["wandb"]
    assert without_console_logger({"trainer.logger": ["tensorboard"]})["trainer.logger"] == ["tensorboard"]
    assert without_console_logger({})["trainer.logger"] == ["jsonl"]  # the default, less console


def test_unknown_and_unavailable_loggers_are_refused_with_the_reason(monkeypatch):
    with pytest.raises(ConfigError, match=r"trainer.logger: unknown logger\(s\) \['clearml'\].*ClearML is not wired in"):
        Config.build({"trainer.logger": ["clearml"]})
    with pytest.raises(ConfigError, match=r"trainer.logger: unknown logger\(s\) \['wandbb'\]; choose from console"):
        Config.build({"trainer.logger": ["wandbb"]})
    # A tracker whose package is missing where the run is built is refused by name, with the fix.
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"\['swanlab'\] named but not installed here: pip install swanlab"):
        Config.build({"trainer.logger": ["swanlab"]})


def test_trl_report_to_names_the_same_trackers():
    assert Config.build({"report_to": ["wandb", "tensorboard"]}).trainer.logger == ["console", "jsonl", "wandb", "tensorboard"]
    with pytest.raises(ConfigError, match=r"report_to: \['comet_ml'\] cannot be honoured"):
        Config.build({"report_to": "comet_ml"})


def test_verl_backend_hands_the_trackers_to_verls_tracking_with_run_folder_defaults(tmp_path, monkeypatch):
    from training.backends.verl.backend import _our_keys_in_verl
    from training.tracking.trackers import verl_tracking_environment

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "TENSORBOARD_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    config = Config.build({"trainer.logger": ["console", "wandb", "tensorboard", "mlflow"]})
    assert _our_keys_in_verl(config, tmp_path)["trainer.logger"] == ["file", "wandb", "tensorboard", "mlflow"]
    env = verl_tracking_environment(config, tmp_path)
    assert env["TENSORBOARD_DIR"] == str((tmp_path / "tensorboard").resolve())
    assert env["MLFLOW_TRACKING_URI"] == f"sqlite:///{(tmp_path / 'mlruns' / 'mlflow.db').resolve()}"
    assert env["WANDB_DIR"] == str(tmp_path.resolve()) and env["WANDB_MODE"] == "offline"
    # A resumed run gets the same W&B id (wandb.init reads WANDB_RUN_ID with WANDB_RESUME=allow).
    assert verl_tracking_environment(config, tmp_path)["WANDB_RUN_ID"] == env["WANDB_RUN_ID"]
    fresh = Config.build({"trainer.logger": ["wandb"], "trainer.resume_mode": "disable"})
    assert verl_tracking_environment(fresh, tmp_path)["WANDB_RUN_ID"] != env["WANDB_RUN_ID"]
