"""Forks: a new run that starts from the weights of a checkpoint another run published.

A fork is an ordinary platform run whose model choice is ``run:<parent>@<step>``: the run form
(``RunForm.clean_model``, ``trainer_args.model_config``) resolves it to the parent's published
checkpoint of that step, found by the platform among the parent's checkpoints
(``<run folder>/checkpoints/<name ending in the step>``, or the artifact store's copy), never a path
anyone gives. Whoever may see the parent (logged in: a share link is for reading only) may fork it
into a project where they may start runs; the fork records its parent and step (``Run.parent``,
``Run.parent_step``), and every way to create one (run page, playground, API, command line) goes
through the run form and ``submission.submit``.

The fork starts from the checkpoint's weights with its own learning-rate schedule, its step count
starting at 1. On the trl backend it also starts with the checkpoint's optimizer state where it fits
(the same trained parameters and shapes; ``training.backends.trl.optimizer_state``); its training
reports what it carried or why not (``Run.optimizer_state``), and ``optimizer_note`` says so on its
page and in the API. The other backends start a fork with a fresh optimizer, and the note says that.
"""

from __future__ import annotations

from pathlib import Path
from webapp.policy.keys import RUN_MODEL
from webapp.runs import artifacts
from webapp.runs.models import Run


def fork_choice(parent_id: int, step: int) -> str:
    """The model choice of a fork of run ``parent_id`` from its checkpoint of ``step``."""
    return f"run:{parent_id}@{step}"


def lineage(model_choice: str) -> dict[str, int]:
    """``{"parent_id", "parent_step"}`` of a run whose model choice is a fork's, else ``{}``."""
    match = RUN_MODEL.match((model_choice or "").strip())
    if not match or match.group(2) is None:
        return {}
    return {"parent_id": int(match.group(1)), "parent_step": int(match.group(2))}


def checkpoint_steps(run: Run) -> list[int]:
    """The steps of ``run``'s published checkpoints, oldest first (those its store holds whole)."""
    return [step for step, _ in artifacts.run_checkpoints(run)]


def checkpoint_folder(run: Run, step: int) -> Path | None:
    """Where a process on this machine loads ``run``'s checkpoint of ``step`` from (None: it has none
    stored): its folder in the local store, or, with a shared store, this machine's copy of it, which
    the worker fetches before training (``artifacts.fetch_trained_model``)."""
    key = dict(artifacts.run_checkpoints(run)).get(step)
    if key is None:
        return None
    if artifacts.shared():
        return artifacts.scratch_folder(run) / key.removeprefix(f"{artifacts.run_prefix(run)}/")
    return Path(artifacts.store().path(key))


def step_problem(parent: Run, step: int) -> str | None:
    """Why ``parent`` cannot be forked from ``step`` (None: it has a checkpoint of that step)."""
    steps = checkpoint_steps(parent)
    if step in steps:
        return None
    stored = ", ".join(map(str, steps[-20:])) if steps else "none"
    if step > parent.steps:
        return f"Run {parent.pk} has not reached step {step} (it is at step {parent.steps}); its stored checkpoints: {stored}."
    return (f"Run {parent.pk} has no stored checkpoint of step {step} (checkpoints are saved every trainer.save_freq "
            f"steps and the oldest removed past trainer.max_checkpoints); its stored checkpoints: {stored}.")


CARRIES_OPTIMIZER_STATE = ("trl",)  # the backends whose training carries a checkpoint's optimizer state into a fork


def optimizer_note(run: Run) -> str:
    """What a fork carried over from its parent, in words for its page and the API ('' for a run that is no fork):
    the weights always; the optimizer state as its training reported it (``Run.optimizer_state``)."""
    if run.parent_step is None:
        return ""
    parent = f"run {run.parent_id}" if run.parent_id else "its parent run (since deleted)"
    weights = (f"Started from the weights of {parent}'s checkpoint at step {run.parent_step}, with its own steps counted "
               "from 1 and its own learning-rate schedule (the parent's schedule is not carried).")
    record = run.optimizer_state
    if record and record.get("carried"):
        return (f"{weights} Optimizer state carried from step {run.parent_step} (the optimizer's moments; its "
                "learning rate and other settings are the fork's own).")
    if record:
        return f"{weights} Optimizer state not carried: {record.get('why') or 'no reason given'}; it trained with a fresh optimizer."
    processor = run.backend.processor if run.backend_id else ""
    if processor not in CARRIES_OPTIMIZER_STATE:
        return (f"{weights} Optimizer state not carried: the {processor or 'chosen'} backend starts a fork with a fresh "
                "optimizer (only the trl backend carries a checkpoint's optimizer state).")
    if run.status == Run.Status.QUEUED or (run.status == Run.Status.RUNNING and not run.steps):
        return (f"{weights} Optimizer state: carried from the checkpoint when training begins, where it fits this run's "
                "trained parameters (said here then).")
    return f"{weights} Optimizer state: not reported (the fork ended before its training began, or ran before this was recorded)."
