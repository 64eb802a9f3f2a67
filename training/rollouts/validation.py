"""Scoring the agent on a test dataset: validation during training, inference after it.

Each task runs ``actor_rollout_ref.rollout.val_kwargs.n`` episodes through the same rollout
engine as training, sampled with ``val_kwargs`` (greedy unless ``do_sample``). Metrics are per
``data_source`` (rows without one count as ``default``), under a prefix (``val`` in training):

- ``<prefix>/<source>/reward``: the mean episode reward;
- ``<prefix>/<source>/pass@1``: the share of correct episodes;
- ``<prefix>/<source>/pass@<n>`` when ``n > 1``: the chance that at least one of ``n`` episodes is
  correct (the unbiased estimator of Chen et al., 2021, "Evaluating Large Language Models Trained
  on Code").
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from training.log import logger
from training.rollouts.models import is_saved_model, load_policy, load_trained
from training.types import Episode, TerminationReason

DEFAULT_SOURCE = "default"  # as the reward functions name a row without data_source


class EvalResult(dict):
    """What ``AgentTrainer.inference()``/``evaluate()`` return: one row per task (its responses,
    rewards and verdicts), and metrics per data source, as ``.rows`` and ``.metrics``. It is the
    dict ``{"metrics": ..., "rows": ...}`` too, so ``json.dump(result, f)`` writes it, as AWorld's
    evolution runner writes what ``await trainer.inference()`` returns."""

    def __init__(self, rows: list[dict[str, Any]] | None = None, metrics: dict[str, float] | None = None) -> None:
        super().__init__(metrics=dict(metrics or {}), rows=list(rows or []))
        self.episodes: list[Episode] = []  # the episodes themselves, for the episode store (not in the dict)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self["rows"]

    @property
    def metrics(self) -> dict[str, float]:
        return self["metrics"]


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The chance that at least one of ``k`` draws from ``n`` episodes (``correct`` of them right) is right."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def summarize(tasks: list[dict], episodes: list[Episode], n: int, prefix: str) -> EvalResult:
    """Rows and per-source metrics of ``n`` episodes per task (``episodes`` group-major, as the engine returns them)."""
    rows, by_source = [], {}
    for index, task in enumerate(tasks):
        group = episodes[index * n : (index + 1) * n]
        source = str(task.get("data_source") or DEFAULT_SOURCE)
        correct = sum(e.is_correct for e in group)
        rows.append({
            "index": index,
            "data_source": source,
            "task": task,
            "responses": [_last_response(e) for e in group],
            "rewards": [e.reward for e in group],
            "is_correct": [bool(e.is_correct) for e in group],
            "termination_reasons": [e.termination_reason.value if e.termination_reason else None for e in group],
            "errors": [e.error for e in group],
            "reward": sum(e.reward for e in group) / n,
            f"pass@{n}": pass_at_k(n, correct, n),
        })
        by_source.setdefault(source, []).append((group, correct))
    metrics: dict[str, float] = {}
    for source, groups in by_source.items():
        rewards = [e.reward for group, _ in groups for e in group]
        metrics[f"{prefix}/{source}/reward"] = sum(rewards) / len(rewards)
        metrics[f"{prefix}/{source}/pass@1"] = sum(pass_at_k(n, c, 1) for _, c in groups) / len(groups)
        if n > 1:
            metrics[f"{prefix}/{source}/pass@{n}"] = sum(pass_at_k(n, c, n) for _, c in groups) / len(groups)
    errors = [e for e in episodes if e.termination_reason == TerminationReason.ERROR]
    if errors:
        logger.warning("%d of %d %s episodes ended with an error; the first: %s", len(errors), len(episodes), prefix, errors[0].error)
    return EvalResult(rows=rows, metrics=metrics)


def _last_response(episode: Episode) -> str:
    for trajectory in reversed(episode.trajectories):
        for step in reversed(trajectory.steps):
            if step.model_response:
                return step.model_response
    return ""


def evaluate(spec: Any, model: Any, tokenizer: Any, config: Any, reward_fn: Any, tasks: list[dict], prefix: str) -> EvalResult:
    """Run ``val_kwargs.n`` episodes of each task with the validation sampling and summarize them.
    Synchronous: call it from code that is not inside an event loop."""
    from training.rollouts.generation import HFBatchGenerator  # brings in torch: imported on first use
    from training.rollouts.episode_runner import EpisodeRunner  # brings in torch: imported on first use

    val = config.actor_rollout_ref.rollout.val_kwargs
    generator = HFBatchGenerator(
        model, tokenizer, temperature=val.temperature if val.do_sample else 1.0, top_p=val.top_p, top_k=val.top_k,
        do_sample=val.do_sample, seed=config.trainer.seed,
    )
    engine = EpisodeRunner(spec, generator, tokenizer, config, reward_fn, is_validation=True)
    episodes = engine.run(tasks, n=val.n)
    result = summarize(tasks, episodes, val.n, prefix)
    result.episodes = episodes
    return result


def validation_tasks(dataset: Any, config: Any) -> list[dict]:
    """The test rows a validation pass scores: the first ``data.val_batch_size`` (all when None)."""
    from training.data import dataset_to_tasks  # brings in datasets: imported on first use

    limit = config.data.val_batch_size
    if limit is not None and limit < len(dataset):
        dataset = dataset.select(range(limit))
    return dataset_to_tasks(dataset)


def trained_model_dir(processor: Any) -> Path | None:
    """The newest weights a run has left: ``final_model``, else its latest checkpoint (None: untrained)."""
    from transformers.trainer_utils import get_last_checkpoint

    final = processor.path / "final_model"
    if is_saved_model(final):
        return final
    configured = processor.config.trainer.default_local_dir
    checkpoints = Path(configured) if configured else processor.path / "checkpoints"
    latest = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    return Path(latest) if latest else None


def run_inference(processor: Any, dataset: Any = None) -> EvalResult:
    """The agent of a built-in processor on ``dataset`` (default: its test dataset), with the
    run's newest weights (or the base model before training). Metrics are named ``test/<source>/...``."""
    import torch

    from training.data import dataset_to_tasks, load_dataset  # brings in datasets: imported on first use

    data = load_dataset(dataset, split="test", what="dataset") if dataset is not None else processor.test_dataset
    if data is None:
        raise ValueError("inference: no dataset to run on; pass one, or give test_dataset when building the trainer.")
    config = processor.config
    trained = trained_model_dir(processor)
    if trained is None:
        logger.info("inference with the base model (the run has no trained weights yet)")
        model, tokenizer, _ = load_policy(config, processor.run_path)
    else:
        logger.info("inference with the trained weights in %s", trained)
        model, tokenizer = load_trained(trained, dtype=config.actor_rollout_ref.model.dtype)
    if config.trainer.device != "cpu" and torch.cuda.is_available():
        model = model.to("cuda")
    tasks = dataset_to_tasks(data)
    result = evaluate(processor.agent_spec, model, tokenizer, config, processor.reward_fn, tasks, prefix="test")
    logger.info("inference on %d task(s): %s", len(tasks), ", ".join(f"{k}={v:.4g}" for k, v in result.metrics.items()))
    return result
