"""Answering playground requests (``webapp.playground``) on a worker slot of the run's queue.

``dispatch_due_requests`` (the housekeeping thread, beside the runs' dispatcher) sends queued
requests to their queue. ``answer_request`` (the Celery task's body) claims one and generates in a
child process, ``python -m workers.playground_child <id>``, so the model's memory is freed after each
answer and a reply that runs past ``PLAYGROUND_REPLY_SECONDS`` is stopped by ending the child's
session (``workers.processes``). ``generate_answer`` (in the child) loads the chosen weights of the
run with transformers, as the trainer does, and writes the answer to the row.

A model's own Python code (``trust_remote_code``) runs only when the registered model the run
trained from is marked trusted by an administrator; a run's trained model used as a base never is.
"""

from __future__ import annotations

import logging
import tempfile
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from training.rollouts.models import adapter_base, is_adapter, is_saved_model, load_trained
from training.trainer import AgentTrainer
from webapp.celery_app import app
from webapp.playground.models import PlaygroundRequest
from webapp.policy.checks import load_training_plugins
from webapp.policy.keys import MODEL_KEY, PYTHON_KEY, TRUST_KEY
from webapp.registry.models import Model
from webapp.runs.downloads import model_folder
from webapp.runs.trainer_args import adapter_base_problem, run_trainer_kwargs
from workers.processes import how_it_ended, run_child_within

logger = logging.getLogger(__name__)

# The Celery task that answers a request (``workers.tasks``), sent by name.
ANSWER_REQUEST = "workers.playground_answer"
BROKER_RETRY_SECONDS = 2.0
# Of the child's output, what a failure shows.
OUTPUT_TAIL_CHARS = 2000


def dispatch_due_requests(limit: int = 100) -> int:
    """Send due queued requests to their queues, and end those nobody took in time. Returns how many were sent."""
    for overdue in PlaygroundRequest.objects.overdue()[:limit]:
        overdue.expire_if_overdue()
    sent = 0
    for asked in PlaygroundRequest.objects.due_for_dispatch().order_by("created_at")[:limit]:
        now = timezone.now()
        # Sent again only if nobody took it within the wait limit's half (a message lost with the broker).
        later = now + timedelta(seconds=max(1, settings.PLAYGROUND_QUEUE_SECONDS // 2))
        taken = PlaygroundRequest.objects.filter(pk=asked.pk, status=asked.Status.QUEUED, dispatch_at=asked.dispatch_at) \
            .update(dispatch_at=later)
        if not taken:
            continue
        try:
            app.send_task(ANSWER_REQUEST, args=[asked.pk], queue=asked.queue)
        except Exception as exc:  # the broker is down: the request stays in the outbox
            PlaygroundRequest.objects.filter(pk=asked.pk, status=asked.Status.QUEUED).update(
                dispatch_at=now + timedelta(seconds=BROKER_RETRY_SECONDS))
            logger.warning("Sending playground request %s to queue %s failed (%s); trying again shortly.", asked.pk, asked.queue, exc)
            break
        sent += 1
    return sent


def answer_request(request_id: int, worker_name: str) -> str:
    """Claim request ``request_id`` and have a child process answer it. Returns its final status
    ('' when it was not this worker's to answer: taken, ended, or past its wait limit)."""
    asked = PlaygroundRequest.objects.select_related("run__backend").filter(pk=request_id).first()
    if asked is None:
        return ""
    if not asked.claim(worker_name):
        asked.expire_if_overdue()
        return ""
    needs_gpu = bool(asked.run.backend and asked.run.backend.needs_gpu)
    code, last_words = run_child_within(
        "workers.playground_child", str(asked.pk), needs_gpu, settings.PLAYGROUND_REPLY_SECONDS, OUTPUT_TAIL_CHARS,
        on_timeout=lambda: asked.finish(asked.Status.FAILED, error=f"The answer took longer than "
                                        f"{settings.PLAYGROUND_REPLY_SECONDS} s and was stopped; ask for fewer new tokens."))
    asked.refresh_from_db()
    if not asked.is_final:  # the child died before it could write its answer (killed, out of memory)
        asked.finish(asked.Status.FAILED, error=f"The generating process {how_it_ended(code)} before answering.\n{last_words}".strip())
    return asked.status


# -- the child process ---------------------------------------------------------------------------

class Refused(Exception):
    """A request that cannot be answered as asked; the message is shown to the person."""


def trusts_remote_code(run) -> bool:
    """Whether the run's weights may run their own code: only when the registered model it trained
    from is marked so by an administrator (a ``run:<id>`` base never is)."""
    entry = Model.objects.filter(name=run.model).first() if run.model and not run.model.startswith("run:") else None
    return bool(entry and entry.trust_remote_code)


def check_adapter_base(run, base: str) -> None:
    problem = adapter_base_problem(run, base)
    if problem:
        raise Refused(problem[0].upper() + problem[1:])


def load_weights(asked: PlaygroundRequest):
    """``(model, tokenizer, device)`` of the chosen saved model of the run, loaded as the trainer loads a model."""
    import torch

    folder = model_folder(asked.run, asked.model_name)
    if folder is None or not is_saved_model(folder):
        raise Refused(f"Run {asked.run_id} has no saved model '{asked.model_name}' on this worker.")
    if is_adapter(folder):
        check_adapter_base(asked.run, adapter_base(folder))
    try:  # a LoRA run saved an adapter: its base model with the adapter merged in
        model, tokenizer = load_trained(folder, trust_remote_code=trusts_remote_code(asked.run), local_files_only=True)
    except ValueError as exc:  # the adapter's base model is not on this worker
        raise Refused(str(exc)) from exc
    device = "cuda" if asked.run.backend and asked.run.backend.needs_gpu and torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(settings.PLAYGROUND_CPU_THREADS)
    model.to(device).eval()
    return model, tokenizer, device


def chat_reply(asked: PlaygroundRequest, model, tokenizer, device: str) -> dict[str, Any]:
    """The next assistant message of the conversation, rendered as in training (the chat template,
    or the contents concatenated for a model without one)."""
    import torch

    from training.rollouts.generation import encode, render_messages  # torch, in the child only: seconds to import

    prompt = encode(tokenizer, render_messages(tokenizer, asked.messages))
    limit = min(settings.PLAYGROUND_MAX_PROMPT_TOKENS,
                getattr(model.config, "max_position_embeddings", None) or settings.PLAYGROUND_MAX_PROMPT_TOKENS)
    if len(prompt) + asked.max_new_tokens > limit:
        raise Refused(f"The conversation is {len(prompt)} tokens; with {asked.max_new_tokens} new tokens that is over "
                      f"the {limit} this model may read here. Start a new conversation or ask for fewer tokens.")
    sampling = {"do_sample": True, "temperature": asked.temperature} if asked.temperature > 0 else {"do_sample": False}
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt], device=device), attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
            max_new_tokens=asked.max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling,
        )
    completion = output[0, len(prompt):].tolist()
    return {"reply": tokenizer.decode(completion, skip_special_tokens=True), "prompt_tokens": len(prompt),
            "reply_tokens": len(completion), "device": device}


def row_episode(asked: PlaygroundRequest, model, tokenizer, device: str) -> dict[str, Any]:
    """One episode of the run's own agent on one row of its dataset, with the chosen weights,
    scored as in training (the environment, or the run's reward)."""
    from training.rollouts.episode_runner import EpisodeRunner  # noqa: I001 (torch, in the child only: seconds to import)
    from training.rollouts.generation import HFBatchGenerator

    load_training_plugins()
    run = asked.run
    with tempfile.TemporaryDirectory(prefix="playground-") as scratch:  # nothing is written into the run's folder
        kwargs = run_trainer_kwargs(run, scratch)
        config = kwargs["config"]
        config.update({MODEL_KEY: str(model_folder(run, asked.model_name)), "actor_rollout_ref.model.tokenizer_path": None,
                       TRUST_KEY: trusts_remote_code(run), PYTHON_KEY: None})
        per_turn = config.get("rllm.agent.max_tokens_per_turn")  # the person's bound holds for each model turn
        config["rllm.agent.max_tokens_per_turn"] = min(int(per_turn), asked.max_new_tokens) if per_turn else asked.max_new_tokens
        kwargs["backend"] = "trl"  # the weights are here: generate with transformers, whatever trained them
        trainer = AgentTrainer(**kwargs)
        processor = trainer.train_processor
        data = processor.train_dataset if asked.split == "train" else processor.test_dataset
        if data is None:
            raise Refused(f"Dataset {run.dataset} has no {asked.split} split in this run; choose the other one.")
        if asked.row_index >= len(data):
            raise Refused(f"Row {asked.row_index}: the {asked.split} split of {run.dataset} has {len(data)} rows (0 to {len(data) - 1}).")
        task = data[int(asked.row_index)]
        generator = HFBatchGenerator(model, tokenizer, temperature=asked.temperature or 1.0, top_p=1.0,
                                     do_sample=asked.temperature > 0, seed=processor.config.trainer.seed)
        engine = EpisodeRunner(processor.agent_spec, generator, tokenizer, processor.config, processor.reward_fn)
        episode = engine.run([task], n=1)[0]
    turns = []
    for trajectory in episode.trajectories:
        for step in trajectory.steps:
            seen = step.observation if step.observation is not None else \
                (step.chat_completions[-1]["content"] if step.chat_completions else "")
            turns.append({"agent": trajectory.name, "prompt": "" if seen is None else str(seen),
                          "response": step.model_response, "reward": float(step.reward), "done": bool(step.done)})
    reason = episode.termination_reason.value if episode.termination_reason else None
    return {"reply": turns[-1]["response"] if turns else "", "device": device,
            "episode": {"task": episode.to_dict()["task"], "reward": episode.reward, "is_correct": bool(episode.is_correct),
                        "num_turns": episode.num_turns, "termination_reason": reason, "error": episode.error, "turns": turns}}


def generate_answer(request_id: int) -> str:
    """Answer a claimed (running) request in this process and record the answer. Returns the status."""
    import traceback

    asked = PlaygroundRequest.objects.select_related("run__backend", "run__agent", "run__dataset", "run__reward").get(pk=request_id)
    if asked.status != asked.Status.RUNNING:
        raise ValueError(f"Playground request {request_id} is {asked.status}, not running; claim it first.")
    try:
        model, tokenizer, device = load_weights(asked)
        fields = chat_reply(asked, model, tokenizer, device) if asked.kind == asked.Kind.CHAT else row_episode(asked, model, tokenizer, device)
    except Refused as exc:
        asked.finish(asked.Status.FAILED, error=str(exc))
    except Exception as exc:  # noqa: BLE001 (whatever went wrong is the answer's error, named)
        logger.exception("playground request %s failed", request_id)
        asked.finish(asked.Status.FAILED, error=f"{exc.__class__.__name__}: {exc}\n{traceback.format_exc(limit=-3)}"[:4000])
    else:
        asked.finish(asked.Status.SUCCEEDED, **fields)
    return asked.status
