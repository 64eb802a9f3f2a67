"""Experiment trackers named in ``trainer.logger``: W&B, TensorBoard, MLflow and SwanLab.

verl's ``Tracking`` class is the reference for the names (``console``, ``wandb``, ``tensorboard``,
``mlflow``, ``swanlab``, ``file``) and for what each receives: the run's config as
hyperparameters, one record per logged step. Every tracker writes through the tool's own library
(``wandb.init``/``Run.log``, tensorboard's ``SummaryWriter``, ``mlflow.MlflowClient``,
``swanlab.init``), never a
file format of ours.

By default each writes under the run folder (``wandb/``, ``tensorboard/``, ``mlruns/``) so that
the folder is complete on its own; a key (``trainer.wandb_dir``, ``trainer.tensorboard_dir``,
``trainer.mlflow_tracking_uri``) or the tool's usual environment variable (``WANDB_DIR``,
``TENSORBOARD_DIR``, ``MLFLOW_TRACKING_URI``) points elsewhere. The external run's id is kept
in ``trackers.json`` in the run folder, so a resumed run continues the same external run.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from training.config import Config, flatten

logger = logging.getLogger("training")

# verl's names, and ours. "file" is verl's JSONL logger: here it is our jsonl sink.
LOGGER_NAMES = ("console", "jsonl", "file", "wandb", "tensorboard", "mlflow", "swanlab")
# verl names of trackers this library does not write to, with what to use instead.
UNSUPPORTED = {
    "clearml": "ClearML is not wired in; use wandb, tensorboard or mlflow",
    "trackio": "trackio is not wired in; use wandb, tensorboard or mlflow",
    "vemlp_wandb": "Volcengine's W&B needs its platform; use wandb",
    "rl_insight": "rl-insight is not wired in; use wandb, tensorboard or mlflow",
}
# The Python package each tracker needs.
PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard", "mlflow": "mlflow", "swanlab": "swanlab"}
IDS_FILE = "trackers.json"
EPISODES_PER_TABLE = 4


def check_logger_names(names: list[str]) -> str | None:
    """What is wrong with ``trainer.logger``, or None. Unknown names and missing packages are named."""
    unknown = [name for name in names if name not in LOGGER_NAMES]
    if unknown:
        reasons = "; ".join(f"{name}: {UNSUPPORTED[name]}" for name in unknown if name in UNSUPPORTED)
        return f"unknown logger(s) {unknown}; choose from {', '.join(LOGGER_NAMES)}." + (f" ({reasons})" if reasons else "")
    missing = [name for name in names if name in PACKAGES and importlib.util.find_spec(PACKAGES[name]) is None]
    if missing:
        return f"{missing} named but not installed here: pip install {' '.join(PACKAGES[n] for n in missing)}."
    return None


def tracker_sinks(config: Config, run_path: str | Path, skip: tuple[str, ...] = ()) -> list:
    """The external trackers ``trainer.logger`` names (console and jsonl are built elsewhere)."""
    names = [name for name in dict.fromkeys(config.trainer.logger) if name not in skip]
    builders = {"wandb": WandbSink, "tensorboard": TensorboardSink, "mlflow": MlflowSink, "swanlab": SwanlabSink}
    return [builders[name](config, Path(run_path)) for name in names if name in builders]


# -- where each writes, and the ids that let a resumed run continue -------------------------------

def tensorboard_dir(config: Config, run_path: Path) -> Path:
    return Path(config.trainer.tensorboard_dir or os.environ.get("TENSORBOARD_DIR") or run_path / "tensorboard")


def mlflow_tracking_uri(config: Config, run_path: Path) -> str:
    """``trainer.mlflow_tracking_uri``, ``MLFLOW_TRACKING_URI``, else a SQLite store in ``<run>/mlruns``
    (MLflow's plain-file store is in maintenance mode and refuses to open without an opt-out)."""
    uri = config.trainer.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    (run_path / "mlruns").mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(run_path / 'mlruns' / 'mlflow.db').resolve()}"


def wandb_dir(config: Config, run_path: Path) -> Path:
    """The folder wandb makes its ``wandb/`` folder in."""
    return Path(config.trainer.wandb_dir or os.environ.get("WANDB_DIR") or run_path)


def read_ids(run_path: str | Path) -> dict[str, Any]:
    """The external runs this run folder reports to, by tracker (``trackers.json``)."""
    path = Path(run_path) / IDS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_ids(run_path: Path, tracker: str, record: dict[str, Any]) -> None:
    ids = read_ids(run_path)
    ids[tracker] = record
    run_path.mkdir(parents=True, exist_ok=True)
    (run_path / IDS_FILE).write_text(json.dumps(ids, indent=2))


def _previous(config: Config, run_path: Path, tracker: str) -> dict[str, Any] | None:
    """The external run to continue: only when this run resumes (``resume_mode=auto``)."""
    if config.trainer.resume_mode != "auto":
        return None
    return read_ids(run_path).get(tracker)


def hyperparameters(config: Config) -> dict[str, Any]:
    """The config as flat dotted keys, values that trackers take (lists and None as text)."""
    return {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in flatten(config.to_dict()).items()}


def conversation(episode: dict[str, Any]) -> str:
    """An episode's last prompt and answer as readable text (what a sampled-conversation table shows)."""
    lines: list[str] = []
    for trajectory in episode.get("trajectories") or []:
        steps = trajectory.get("steps") or []
        if not steps:
            continue
        last = steps[-1]
        for message in last.get("chat_completions") or []:
            lines.append(f"{message.get('role', '?')}: {message.get('content', '')}")
        if last.get("model_response") and not (last.get("chat_completions") or [{}])[-1].get("role") == "assistant":
            lines.append(f"assistant: {last['model_response']}")
    return "\n".join(lines)


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not (math.isnan(v) or math.isinf(v))}


# -- the trackers ---------------------------------------------------------------------------------

class WandbSink:
    """Weights & Biases through ``wandb.init``: online with an API key, offline otherwise (``WANDB_MODE``
    wins). The config goes in as the run's config, sampled conversations as a ``wandb.Table``."""

    def __init__(self, config: Config, run_path: Path) -> None:
        import wandb

        previous = _previous(config, run_path, "wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        if mode == "offline" and not os.environ.get("WANDB_MODE"):
            logger.info("wandb: no WANDB_API_KEY, so the run is written offline under %s (wandb sync uploads it)", wandb_dir(config, run_path))
        directory = wandb_dir(config, run_path)
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            dir=str(directory), project=config.trainer.project_name, name=config.trainer.experiment_name,
            entity=config.trainer.wandb_entity or os.environ.get("WANDB_ENTITY"), config=hyperparameters(config),
            id=previous["id"] if previous else None, resume="allow" if previous else None, mode=mode,
            reinit="create_new", settings=wandb.Settings(silent=True, console="off"),
        )
        url = self.run.get_url() if mode == "online" else None
        _write_ids(run_path, "wandb", {"id": self.run.id, "project": self.run.project, "entity": self.run.entity,
                                       "mode": mode, "dir": self.run.dir, "url": url})

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=["step", "data_source", "conversation", "reward", "termination"])
        for episode in episodes[:EPISODES_PER_TABLE]:
            task = episode.get("task") if isinstance(episode.get("task"), dict) else {}
            table.add_data(step, str(task.get("data_source", "")), conversation(episode),
                           float(episode.get("reward") or 0.0), str(episode.get("termination_reason") or ""))
        self.run.log({"episodes": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class TensorboardSink:
    """TensorBoard through ``SummaryWriter``: scalars per step, the config and sampled episodes as text."""

    def __init__(self, config: Config, run_path: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = tensorboard_dir(config, run_path)
        self.writer = SummaryWriter(log_dir=str(self.directory))
        if _previous(config, run_path, "tensorboard") is None:  # a resumed run appends to the same folder
            rows = "\n".join(f"| {k} | {v} |" for k, v in hyperparameters(config).items())
            self.writer.add_text("config", "| key | value |\n|---|---|\n" + rows, 0)
        _write_ids(run_path, "tensorboard", {"dir": str(self.directory)})

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        text = "\n\n---\n\n".join(
            f"reward {float(e.get('reward') or 0.0):.3f}\n\n```\n{conversation(e)}\n```" for e in episodes[:EPISODES_PER_TABLE]
        )
        self.writer.add_text("episodes", text, step)

    def close(self) -> None:
        self.writer.close()


class MlflowSink:
    """MLflow through ``MlflowClient`` (no global active run, so several runs in one process are fine).

    The experiment is ``trainer.project_name``, the run name ``trainer.experiment_name`` (verl's
    mapping); the config is logged as params, sampled episodes as JSON artifacts per step.
    """

    def __init__(self, config: Config, run_path: Path) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.uri = mlflow_tracking_uri(config, run_path)
        self.client = MlflowClient(self.uri)
        previous = _previous(config, run_path, "mlflow")
        if previous and previous.get("uri") == self.uri:
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name(config.trainer.project_name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            elif self.uri.startswith("sqlite:///") and str(run_path.resolve()) in self.uri:
                artifacts = (run_path / "mlruns" / "artifacts").resolve().as_uri()
                experiment_id = self.client.create_experiment(config.trainer.project_name, artifact_location=artifacts)
            else:
                experiment_id = self.client.create_experiment(config.trainer.project_name)
            run = self.client.create_run(experiment_id, run_name=config.trainer.experiment_name)
            self.run_id = run.info.run_id
            params = [Param(_mlflow_name(k), str(v)[:6000]) for k, v in hyperparameters(config).items()]
            for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=params[start:start + 100])
        _write_ids(run_path, "mlflow", {"uri": self.uri, "run_id": self.run_id, "url": _mlflow_url(self.uri, self.client, self.run_id)})

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(_mlflow_name(k), v, now, step) for k, v in _finite(metrics).items()])

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        rows = [{"conversation": conversation(e), "reward": e.get("reward"), "termination": e.get("termination_reason")}
                for e in episodes[:EPISODES_PER_TABLE]]
        self.client.log_dict(self.run_id, rows, f"episodes/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


class SwanlabSink:
    """SwanLab through ``swanlab.init``: online with ``SWANLAB_API_KEY``, offline otherwise
    (``SWANLAB_MODE`` wins), under ``SWANLAB_LOG_DIR`` or ``<run>/swanlog``. An online run resumes
    the same experiment by id; SwanLab resumes only online, so an offline resume starts a new local
    run file beside the first (``swanlab sync`` uploads each)."""

    def __init__(self, config: Config, run_path: Path) -> None:
        import swanlab

        previous = _previous(config, run_path, "swanlab")
        mode = os.environ.get("SWANLAB_MODE") or ("online" if os.environ.get("SWANLAB_API_KEY") else "offline")
        directory = Path(os.environ.get("SWANLAB_LOG_DIR") or run_path / "swanlog")
        directory.mkdir(parents=True, exist_ok=True)
        resume = previous if previous and mode == "online" and previous.get("mode") == "online" else None
        self.run = swanlab.init(
            project=config.trainer.project_name, name=config.trainer.experiment_name, config=hyperparameters(config),
            log_dir=str(directory), mode=mode, reinit=True,
            **({"id": resume["id"], "resume": "allow"} if resume else {}),
        )
        _write_ids(run_path, "swanlab", {"id": self.run.id, "mode": mode, "dir": str(directory)})

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(_finite(metrics), step=step)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        import swanlab

        texts = [swanlab.Text(conversation(episode)) for episode in episodes[:EPISODES_PER_TABLE]]
        if texts:
            self.run.log({"episodes": texts}, step=step)

    def close(self) -> None:
        self.run.finish()


def _mlflow_name(name: str) -> str:
    """MLflow keys allow letters, digits, ``_ - . / `` and space: ``val/x/pass@1`` becomes ``val/x/pass_at_1``."""
    return re.sub(r"[^\w\-. /]", "_", name.replace("@", "_at_"))


def _mlflow_url(uri: str, client: Any, run_id: str) -> str | None:
    """The run's page on an MLflow server (None for a local store)."""
    if not uri.startswith(("http://", "https://")):
        return None
    experiment_id = client.get_run(run_id).info.experiment_id
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


# -- verl: its own Tracking class writes the trackers; this says where --------------------------

VERL_TRACKERS = ("wandb", "tensorboard", "mlflow", "swanlab")


def verl_tracker_names(config: Config) -> list[str]:
    """The trackers of ``trainer.logger`` that verl's ``Tracking`` writes to on the verl backend."""
    return [name for name in dict.fromkeys(config.trainer.logger) if name in VERL_TRACKERS]


def verl_tracking_environment(config: Config, run_path: str | Path) -> dict[str, str]:
    """Environment variables verl's ``Tracking`` reads, so it writes where our trackers would
    (under the run folder by default) and a resumed run continues the same W&B and MLflow runs."""
    run_path = Path(run_path)
    names = verl_tracker_names(config)
    env: dict[str, str] = {}
    if "tensorboard" in names:
        env["TENSORBOARD_DIR"] = str(tensorboard_dir(config, run_path).resolve())
        _write_ids(run_path, "tensorboard", {"dir": env["TENSORBOARD_DIR"]})
    if "wandb" in names:
        previous = _previous(config, run_path, "wandb")
        run_id = previous["id"] if previous else os.urandom(4).hex()
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        env.update({"WANDB_DIR": str(wandb_dir(config, run_path).resolve()), "WANDB_RUN_ID": run_id,
                    "WANDB_RESUME": "allow", "WANDB_MODE": mode})
        entity = config.trainer.wandb_entity or os.environ.get("WANDB_ENTITY")
        if entity:
            env["WANDB_ENTITY"] = entity
        _write_ids(run_path, "wandb", {"id": run_id, "project": config.trainer.project_name, "entity": entity, "mode": mode})
    if "mlflow" in names:
        env["MLFLOW_TRACKING_URI"] = mlflow_tracking_uri(config, run_path)
        previous = _previous(config, run_path, "mlflow")
        if previous and previous.get("uri") == env["MLFLOW_TRACKING_URI"]:
            env["MLFLOW_RUN_ID"] = previous["run_id"]  # verl attaches to it instead of starting another
    if "swanlab" in names:
        env["SWANLAB_LOG_DIR"] = os.environ.get("SWANLAB_LOG_DIR") or str((run_path / "swanlog").resolve())
        env["SWANLAB_MODE"] = os.environ.get("SWANLAB_MODE", "local")
    return env
