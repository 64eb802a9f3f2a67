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

A tracker that sends over the network (W&B online, an MLflow server) sends only through the
egress guard (``training.isolation.egress``): its server is judged before the tracker starts and every
connection is judged again as it is made. What fails is told in our words (``TrackerError``:
the guard's refusal, the status code, a timeout), never with the server's own text.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from training.config import Config, flatten
from training.config.names import register_value_check
from training.isolation.egress import EgressProxy, Guard
from training.errors import EgressRefused, TrackerError

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
WANDB_DEFAULT_URL = "https://api.wandb.ai"
# Where an MLflow server may keep a run's artifacts for this process to write them: through the
# server itself, or an http(s) URL (both through the egress guard). Not file:, s3: and the like,
# which a server could use to make this process write into its own disk or a cloud account.
MLFLOW_ARTIFACT_SCHEMES = ("mlflow-artifacts", "http", "https")


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


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL: what a message may name (never a path or credentials)."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}"


@contextmanager
def _closing_on_error(proxy: EgressProxy | None) -> Iterator[None]:
    try:
        yield
    except BaseException:
        if proxy is not None:
            proxy.close()
        raise


def _judged(tool: str, url: str) -> Guard:
    """The guard, once it has judged ``tool``'s server ``url``. Raises TrackerError."""
    guard = Guard()
    try:
        guard.check_url(url)
    except EgressRefused as exc:
        raise TrackerError(f"{tool} at {origin(url)}: {exc}") from None
    return guard


def _guarded_proxy(tool: str, url: str) -> EgressProxy:
    """A proxy for ``tool``'s sends to ``url``, once the guard has judged ``url``."""
    return EgressProxy(_judged(tool, url))


# -- the trackers ---------------------------------------------------------------------------------

class WandbSink:
    """Weights & Biases through ``wandb.init``: online with an API key, offline otherwise (``WANDB_MODE``
    wins). The config goes in as the run's config, sampled conversations as a ``wandb.Table``.

    Online, the server (``WANDB_BASE_URL``, else wandb.ai) is judged by the egress guard first, and
    wandb-core (W&B's Go service, which makes the network calls) sends through the guard's proxy."""

    def __init__(self, config: Config, run_path: Path) -> None:
        import wandb

        previous = _previous(config, run_path, "wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        if mode == "offline" and not os.environ.get("WANDB_MODE"):
            logger.info("wandb: no WANDB_API_KEY, so the run is written offline under %s (wandb sync uploads it)", wandb_dir(config, run_path))
        directory = wandb_dir(config, run_path)
        directory.mkdir(parents=True, exist_ok=True)
        base_url = os.environ.get("WANDB_BASE_URL") or WANDB_DEFAULT_URL
        self.server = origin(base_url)
        self.proxy = _guarded_proxy("W&B", base_url) if mode == "online" else None
        # Online, the server, key and proxy are this run's own settings: wandb would otherwise keep
        # the first run's server and key for every later run in the process.
        online = {"base_url": base_url, "api_key": os.environ.get("WANDB_API_KEY"),
                  "http_proxy": self.proxy.url, "https_proxy": self.proxy.url} if self.proxy else {}
        with _closing_on_error(self.proxy), self._sending("starting the run"):
            self.run = wandb.init(
                dir=str(directory), project=config.trainer.project_name, name=config.trainer.experiment_name,
                entity=config.trainer.wandb_entity or os.environ.get("WANDB_ENTITY"), config=hyperparameters(config),
                id=previous["id"] if previous else None, resume="allow" if previous else None, mode=mode,
                reinit="create_new", settings=wandb.Settings(silent=True, console="off", **online),
            )
            url = self.run.get_url() if mode == "online" else None
        _write_ids(run_path, "wandb", {"id": self.run.id, "project": self.run.project, "entity": self.run.entity,
                                       "mode": mode, "dir": self.run.dir, "url": url})

    @contextmanager
    def _sending(self, what: str) -> Iterator[None]:
        """W&B's errors quote its server; online, what failed is told in our words instead."""
        if self.proxy is None:
            yield
            return
        try:
            with self.proxy.route():  # wandb's Python side, where it sends itself
                yield
        except Exception as exc:
            if self.proxy.refusals:
                reason = self.proxy.refusals[-1]
            else:
                reason = f"it failed ({type(exc).__name__}; the server's answer is not shown here)"
            raise TrackerError(f"W&B at {self.server}, {what}: {reason}") from None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with self._sending("logging a step"):
            self.run.log(metrics, step=step)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=["step", "data_source", "conversation", "reward", "termination"])
        for episode in episodes[:EPISODES_PER_TABLE]:
            task = episode.get("task") if isinstance(episode.get("task"), dict) else {}
            table.add_data(step, str(task.get("data_source", "")), conversation(episode),
                           float(episode.get("reward") or 0.0), str(episode.get("termination_reason") or ""))
        with self._sending("logging episodes"):
            self.run.log({"episodes": table}, step=step)

    def close(self) -> None:
        try:
            with self._sending("finishing the run"):
                self.run.finish()
        finally:
            if self.proxy is not None:
                self.proxy.close()


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
    mapping); the config is logged as params, sampled episodes as JSON artifacts per step. A
    server (an http(s) URI) is judged by the egress guard first and every request goes through
    the guard's proxy; episodes are sent only where the server keeps artifacts through itself or
    an http(s) URL (``MLFLOW_ARTIFACT_SCHEMES``).
    """

    def __init__(self, config: Config, run_path: Path) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.uri = mlflow_tracking_uri(config, run_path)
        self.server = origin(self.uri) if self.uri.startswith(("http://", "https://")) else None
        self.proxy = _guarded_proxy("MLflow", self.uri) if self.server else None
        self.episodes = True
        with _closing_on_error(self.proxy), self._sending("starting the run"):
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
                    self.client.log_batch(self.run_id, params=params[start:start + 100], synchronous=True)
            info = self.client.get_run(self.run_id).info
            url = f"{self.uri.rstrip('/')}/#/experiments/{info.experiment_id}/runs/{self.run_id}" if self.server else None
        if self.server and urlsplit(info.artifact_uri or "").scheme not in MLFLOW_ARTIFACT_SCHEMES:
            self.episodes = False
            logger.warning("MLflow at %s keeps this run's artifacts at a %s: location, which this process does not write to; "
                           "sampled episodes are not sent there.", self.server, urlsplit(info.artifact_uri or "").scheme or "(no)")
        _write_ids(run_path, "mlflow", {"uri": self.uri, "run_id": self.run_id, "url": url})

    @contextmanager
    def _sending(self, what: str) -> Iterator[None]:
        """MLflow's errors quote its server's answer; for a server, what failed is told in our words."""
        if self.proxy is None:
            yield
            return
        try:
            with self.proxy.route() as route:
                yield
        except Exception:
            raise TrackerError(route.failure(f"MLflow at {self.server}, {what}")) from None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self._sending("logging a step"):
            self.client.log_batch(self.run_id, metrics=[Metric(_mlflow_name(k), v, now, step) for k, v in _finite(metrics).items()],
                                  synchronous=True)

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        if not self.episodes:
            return
        rows = [{"conversation": conversation(e), "reward": e.get("reward"), "termination": e.get("termination_reason")}
                for e in episodes[:EPISODES_PER_TABLE]]
        with self._sending("logging episodes"):
            self.client.log_dict(self.run_id, rows, f"episodes/step_{step:06d}.json")

    def close(self) -> None:
        try:
            with self._sending("finishing the run"):
                self.client.set_terminated(self.run_id, "FINISHED")
        finally:
            if self.proxy is not None:
                self.proxy.close()


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


# -- verl: its own Tracking class writes the trackers; this says where --------------------------

VERL_TRACKERS = ("wandb", "tensorboard", "mlflow", "swanlab")
_verl_proxy: EgressProxy | None = None  # W&B's sends from verl's processes, for this process's life


def verl_tracker_names(config: Config) -> list[str]:
    """The trackers of ``trainer.logger`` that verl's ``Tracking`` writes to on the verl backend."""
    return [name for name in dict.fromkeys(config.trainer.logger) if name in VERL_TRACKERS]


def verl_tracking_environment(config: Config, run_path: str | Path) -> dict[str, str]:
    """Environment variables verl's ``Tracking`` reads, so it writes where our trackers would
    (under the run folder by default) and a resumed run continues the same W&B and MLflow runs.

    The egress guard holds there too: W&B online sends through this process's guard proxy
    (``WANDB_HTTP_PROXY``/``WANDB_HTTPS_PROXY``, which wandb takes as its proxy settings). verl's
    MLflow client runs in verl's processes, where no route through the guard can be set for it,
    so an MLflow server is accepted there only when an admin allowed its host."""
    global _verl_proxy
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
        if mode == "online":
            guard = _judged("W&B", os.environ.get("WANDB_BASE_URL") or WANDB_DEFAULT_URL)
            _verl_proxy = _verl_proxy or EgressProxy(guard)
            env.update({"WANDB_HTTP_PROXY": _verl_proxy.url, "WANDB_HTTPS_PROXY": _verl_proxy.url})
        entity = config.trainer.wandb_entity or os.environ.get("WANDB_ENTITY")
        if entity:
            env["WANDB_ENTITY"] = entity
        _write_ids(run_path, "wandb", {"id": run_id, "project": config.trainer.project_name, "entity": entity, "mode": mode})
    if "mlflow" in names:
        env["MLFLOW_TRACKING_URI"] = mlflow_tracking_uri(config, run_path)
        parts = urlsplit(env["MLFLOW_TRACKING_URI"])
        if parts.scheme in ("http", "https") and not Guard().allows_host(
                parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)):
            raise TrackerError(f"MLflow at {origin(env['MLFLOW_TRACKING_URI'])}: on the verl backend verl's own processes "
                               "send to MLflow, outside the egress guard's reach, so only a server whose host an admin "
                               "allowed (EGRESS_ALLOWED_HOSTS) is used there; leave trainer.mlflow_tracking_uri unset "
                               "for a store in the run folder.")
        previous = _previous(config, run_path, "mlflow")
        if previous and previous.get("uri") == env["MLFLOW_TRACKING_URI"]:
            env["MLFLOW_RUN_ID"] = previous["run_id"]  # verl attaches to it instead of starting another
    if "swanlab" in names:
        env["SWANLAB_LOG_DIR"] = os.environ.get("SWANLAB_LOG_DIR") or str((run_path / "swanlog").resolve())
        env["SWANLAB_MODE"] = os.environ.get("SWANLAB_MODE", "local")
    return env


register_value_check("trainer.logger", check_logger_names)
