"""Evaluating a stored checkpoint on a dataset (``webapp.checkpoints``) on a worker slot of the run's queue.

``run_evaluation`` (the Celery task's body) claims the evaluation and scores in a child process,
``python -m workers.evaluation_child <id>``, so the model's memory is freed after each and one that
runs past ``EVALUATION_SECONDS`` is stopped by ending the child's session. ``score_checkpoint`` (in
the child) loads the checkpoint's weights with transformers, builds the run's agent and reward as
the playground does (``workers.playground.row_episode``), and scores the dataset's rows with the
validation scoring of training (``training.rollouts.validation.evaluate``): reward and pass@k per
data source, one ``EvaluationScore`` row each.
"""

from __future__ import annotations

import logging
import tempfile
import traceback

from django.conf import settings
from django.db import transaction

from training.rollouts.models import adapter_base, is_adapter, is_saved_model, load_trained
from training.trainer import AgentTrainer
from webapp.checkpoints.models import Evaluation, EvaluationScore
from webapp.policy.checks import load_training_plugins
from webapp.policy.keys import MODEL_KEY, PYTHON_KEY, TRUST_KEY
from webapp.runs.downloads import model_folder
from webapp.runs.trainer_args import run_trainer_kwargs
from workers.playground import Refused, check_adapter_base, trusts_remote_code
from workers.processes import how_it_ended, run_child_within

logger = logging.getLogger(__name__)

EVALUATE_CHECKPOINT = "workers.evaluate_checkpoint"  # as webapp.checkpoints.logic sends it
OUTPUT_TAIL_CHARS = 2000
PREFIX = "eval"


def run_evaluation(evaluation_id: int, worker_name: str) -> str:
    """Claim evaluation ``evaluation_id`` and have a child process score it. Returns its final
    status ('' when it was not this worker's: taken by another, or ended)."""
    evaluation = Evaluation.objects.select_related("run__backend").filter(pk=evaluation_id).first()
    if evaluation is None or not evaluation.claim(worker_name):
        return ""
    needs_gpu = bool(evaluation.run.backend and evaluation.run.backend.needs_gpu)
    code, last_words = run_child_within(
        "workers.evaluation_child", str(evaluation.pk), needs_gpu, settings.EVALUATION_SECONDS, OUTPUT_TAIL_CHARS,
        on_timeout=lambda: evaluation.finish(Evaluation.Status.FAILED, f"The evaluation took longer than "
                                             f"{settings.EVALUATION_SECONDS} s and was stopped; score fewer rows (max_tasks)."))
    evaluation.refresh_from_db()
    if not evaluation.is_final:  # the child died before it could record an end (killed, out of memory)
        evaluation.finish(Evaluation.Status.FAILED, f"The evaluating process {how_it_ended(code)} before it finished.\n{last_words}".strip())
        evaluation.refresh_from_db()
    return evaluation.status


def score_checkpoint(evaluation_id: int) -> str:
    """Score a claimed (running) evaluation in this process and record its scores. Returns the status."""
    evaluation = Evaluation.objects.select_related(
        "run__backend", "run__agent", "run__dataset", "run__reward", "run__owner", "dataset").get(pk=evaluation_id)
    if evaluation.status != Evaluation.Status.RUNNING:
        raise ValueError(f"Evaluation {evaluation_id} is {evaluation.status}, not running; claim it first.")
    try:
        scores, tasks = _score(evaluation)
    except Refused as exc:
        evaluation.finish(Evaluation.Status.FAILED, str(exc))
    except Exception as exc:  # noqa: BLE001 (whatever went wrong is the evaluation's error, named)
        logger.exception("evaluation %s failed", evaluation_id)
        evaluation.finish(Evaluation.Status.FAILED, f"{exc.__class__.__name__}: {exc}\n{traceback.format_exc(limit=-3)}")
    else:
        with transaction.atomic():
            EvaluationScore.objects.bulk_create([EvaluationScore(evaluation=evaluation, **score) for score in scores])
            Evaluation.objects.filter(pk=evaluation.pk).update(tasks=tasks)
            evaluation.finish(Evaluation.Status.SUCCEEDED)
    evaluation.refresh_from_db()
    return evaluation.status


def _score(evaluation: Evaluation) -> tuple[list[dict], int]:
    import torch

    from training.data import dataset_to_tasks  # noqa: I001 (datasets and torch, in the child only)
    from training.rollouts.validation import evaluate

    run, dataset = evaluation.run, evaluation.dataset
    folder = model_folder(run, f"checkpoint-{evaluation.step}")
    if folder is None or not is_saved_model(folder):
        raise Refused(f"Run {run.pk} keeps no checkpoint at step {evaluation.step} on this worker (rotated out or deleted).")
    if is_adapter(folder):
        check_adapter_base(run, adapter_base(folder))
    load_training_plugins()
    k = evaluation.episodes_per_task
    spec = dataset.trainer_kwargs()
    rows = spec["val_dataset"] or spec["train_dataset"]
    with tempfile.TemporaryDirectory(prefix="evaluation-") as scratch:  # nothing is written into the run's folder
        kwargs = run_trainer_kwargs(run, scratch)
        config = kwargs["config"]
        config.update({
            MODEL_KEY: str(folder), "actor_rollout_ref.model.tokenizer_path": None, TRUST_KEY: trusts_remote_code(run),
            PYTHON_KEY: None, **dataset.config_overrides(),
            "data.train_batch_size": 1, "data.val_batch_size": None, "trainer.logger": [], "trainer.log_episodes": False,
            "actor_rollout_ref.rollout.val_kwargs.n": k,
        })
        if k > 1:  # k greedy episodes would all be one: pass@k samples them
            config["actor_rollout_ref.rollout.val_kwargs.do_sample"] = True
            if not config.get("actor_rollout_ref.rollout.val_kwargs.temperature"):
                config["actor_rollout_ref.rollout.val_kwargs.temperature"] = 1.0
        kwargs.update({"backend": "trl", "train_dataset": rows, "val_dataset": rows})  # the weights are here: transformers
        trainer = AgentTrainer(**kwargs)
        processor = trainer.train_processor
        data = processor.test_dataset
        if data is None or len(data) == 0:
            raise Refused(f"Dataset {dataset} has no rows in its {evaluation.split} split.")
        data = data.select(range(min(len(data), evaluation.max_tasks)))
        model, tokenizer = load_trained(folder, trust_remote_code=trusts_remote_code(run), local_files_only=True,
                                        dtype=processor.config.actor_rollout_ref.model.dtype)
        if run.backend and run.backend.needs_gpu and torch.cuda.is_available():
            model = model.to("cuda")
        tasks = dataset_to_tasks(data)
        result = evaluate(processor.agent_spec, model, tokenizer, processor.config, processor.reward_fn, tasks, prefix=PREFIX)
    counts: dict[str, int] = {}
    for row in result.rows:
        counts[row["data_source"]] = counts.get(row["data_source"], 0) + 1
    scores = []
    for source, count in sorted(counts.items()):
        metric = f"{PREFIX}/{source}/"
        pass_1 = result.metrics[metric + "pass@1"]
        scores.append({"data_source": source[:200], "tasks": count, "reward": result.metrics[metric + "reward"],
                       "pass_at_1": pass_1, "pass_at_k": result.metrics.get(metric + f"pass@{k}", pass_1)})
    return scores, len(tasks)
