"""A project's tracking targets applied to one of its runs, and the links to the external runs.

Non-secret settings go into the run's config (``trainer.logger``, ``trainer.project_name``,
``trainer.wandb_entity``, ``trainer.mlflow_tracking_uri``): they show in the run's final config.
Secrets (the W&B API key, the MLflow password) go only into the training process's environment,
where wandb and mlflow read them; they are in no config, log or page.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings

from training.config import TrainerConfig
from training.isolation.egress import ALLOWED_HOSTS_ENV
from training.tracking.trackers import IDS_FILE, read_ids
from webapp.integrations.alerts import ThresholdSink
from webapp.integrations.models import TrackingTarget
from webapp.runs import artifacts
from webapp.sweeps.engine import PruningSink


def target_of(run):
    if not run.project_id:
        return None
    return TrackingTarget.objects.filter(project_id=run.project_id).first()


def tracking_config(run, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (flat keys) with the project's trackers added and pointed at its targets."""
    target = target_of(run)
    if target is None or not target.loggers():
        return config
    config = dict(config)
    names = list(config.get("trainer.logger") or TrainerConfig().logger)
    config["trainer.logger"] = list(dict.fromkeys([*names, *target.loggers()]))
    config["trainer.experiment_name"] = f"run-{run.pk}" + (f"-{run.name}" if run.name else "")
    if target.wandb_project:
        config["trainer.project_name"] = target.wandb_project
        if target.wandb_entity:
            config["trainer.wandb_entity"] = target.wandb_entity
    if target.mlflow_tracking_uri:
        config["trainer.mlflow_tracking_uri"] = target.mlflow_server
        if not target.wandb_project:
            config["trainer.project_name"] = str(run.project)
    return config


# What the training process's trackers take from its environment as a destination or its secret:
# only a project's target sets them (a key the worker was started with must not follow a member's URL).
TRACKER_ENVIRONMENT = ("WANDB_API_KEY", "WANDB_BASE_URL", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def tracking_environment(run) -> dict[str, str]:
    """What wandb and mlflow read from the environment: keys and passwords, never written down.
    Each secret comes from the same saved target as its destination (the form clears a secret
    whose destination changed)."""
    target = target_of(run)
    env: dict[str, str] = {}
    if target is None:
        return env
    if target.wandb_project and target.wandb_api_key:
        env["WANDB_API_KEY"] = target.wandb_api_key
        env["WANDB_MODE"] = "online"
        if target.wandb_base_url:
            env["WANDB_BASE_URL"] = target.wandb_server
    if target.mlflow_tracking_uri and target.mlflow_username:
        env["MLFLOW_TRACKING_USERNAME"] = target.mlflow_username
        env["MLFLOW_TRACKING_PASSWORD"] = target.mlflow_password
    return env


def prepare_run(run, trainer_kwargs: dict[str, Any]) -> list:
    """In the training process, before the trainer is built: the project's trackers in the config,
    their secrets in this process's environment (and the admin's allowed hosts, for the egress
    guard the trackers send through), the sink that raises threshold alerts and, for a
    sweep's trial, the one that prunes it."""
    trainer_kwargs["config"] = tracking_config(run, trainer_kwargs.get("config") or {})
    for name in TRACKER_ENVIRONMENT:
        os.environ.pop(name, None)
    os.environ.update(tracking_environment(run))
    os.environ[ALLOWED_HOSTS_ENV] = ",".join(settings.EGRESS_ALLOWED_HOSTS)  # the trackers' egress guard reads it
    return [ThresholdSink(run), PruningSink(run)]


def external_links(run) -> list[dict[str, str]]:
    """The run's external runs, from ``trackers.json`` in its folder: a link where the tool has a
    page (W&B online, an MLflow server), else where the files are."""
    if artifacts.shared():  # the folder was a worker's scratch: its trackers.json is in the store
        ids = artifacts.read_json(run, IDS_FILE)
    elif not run.run_path:
        return []
    else:
        ids = read_ids(run.run_path)
    links = []
    wandb = ids.get("wandb")
    if wandb:
        target = target_of(run)
        url = wandb.get("url")
        if not url and wandb.get("mode") == "online" and wandb.get("entity") and wandb.get("project"):
            base = (target.wandb_server if target and target.wandb_base_url else "https://wandb.ai").rstrip("/")
            url = f"{base}/{wandb['entity']}/{wandb['project']}/runs/{wandb['id']}"
        links.append({"tool": "W&B", "url": url or "", "text": url or f"offline run {wandb['id']} (wandb sync uploads it)"})
    mlflow = ids.get("mlflow")
    if mlflow:
        url = mlflow.get("url")
        links.append({"tool": "MLflow", "url": url or "", "text": url or f"run {mlflow['run_id']} in the run folder's mlruns/"})
    if ids.get("tensorboard"):
        links.append({"tool": "TensorBoard", "url": "", "text": "event files in the run folder's tensorboard/"})
    return links
