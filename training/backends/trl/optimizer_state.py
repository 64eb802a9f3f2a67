"""Carrying a trainer checkpoint's optimizer state into a run that starts from that checkpoint's
weights (a fork: its ``actor_rollout_ref.model.path`` is another run's ``checkpoint-<n>`` folder).

Only the state is carried (AdamW's moments and its step counts, per parameter); the settings of the
parameter groups (learning rate, weight decay, betas) stay the new run's own, so a learning rate
changed for the fork takes effect. The learning-rate schedule is not carried: the new run counts
its own steps from 1. The state is carried only where it fits: the same parameter groups holding
the same number of parameters of the same shapes, saved by the same kind of optimizer, and not a
LoRA adapter's (which the new run merges into its weights, training a new adapter of the same shapes);
else the run starts with a fresh optimizer, and the reason is said.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.rollouts.models import is_adapter

OPTIMIZER_FILE = "optimizer.pt"  # what transformers' Trainer saves in each checkpoint (OPTIMIZER_NAME)
TRAINER_STATE_FILE = "trainer_state.json"


def carry_optimizer_state(optimizer: Any, checkpoint: str | Path) -> str | None:
    """Load the optimizer state saved in the transformers checkpoint folder ``checkpoint`` into
    ``optimizer``, freshly built for the run's trained parameters, keeping ``optimizer``'s own
    parameter-group settings. Returns None when carried, else why not (``optimizer`` is then as it was)."""
    import torch  # brings in torch: imported on first use

    if is_adapter(checkpoint):
        return ("the checkpoint is a LoRA adapter, which a run starting from it merges into its weights before it "
                "trains new parameters (a new adapter, or every weight): the saved state is of the merged adapter")
    path = Path(checkpoint) / OPTIMIZER_FILE
    if not path.is_file():
        saved_by_trainer = (Path(checkpoint) / TRAINER_STATE_FILE).is_file()
        return (f"the checkpoint holds no {OPTIMIZER_FILE} (saved with the weights only)" if saved_by_trainer
                else f"the model folder is no trainer checkpoint (it holds no {OPTIMIZER_FILE})")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a reason to start fresh, said
        return f"the checkpoint's {OPTIMIZER_FILE} could not be read ({type(exc).__name__}: {exc})"
    problem = state_mismatch(optimizer.param_groups, saved)
    if problem:
        return problem
    own_settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)  # the state, cast to each parameter's device and dtype
    for group, settings in zip(optimizer.param_groups, own_settings):
        group.update(settings)  # the saved learning rate and schedule's initial_lr were the parent's
    return None


def state_mismatch(groups: list[dict[str, Any]], saved: Any) -> str | None:
    """Why the optimizer state ``saved`` does not fit an optimizer of parameter ``groups``, or None."""
    import torch  # brings in torch: imported on first use

    saved_groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(saved_groups, list) or not isinstance(saved.get("state"), dict):
        return f"the checkpoint's {OPTIMIZER_FILE} holds no optimizer state"
    own_counts = [len(group["params"]) for group in groups]
    saved_counts = [len(group.get("params", ())) for group in saved_groups]
    if own_counts != saved_counts:
        return (f"the checkpoint's optimizer holds {sum(saved_counts)} parameter tensors in groups of {saved_counts}, "
                f"this run trains {sum(own_counts)} in groups of {own_counts} (another set of trained parameters: "
                "LoRA against full fine-tuning, another LoRA rank or target modules, or another model)")
    own_keys = set().union(*(group.keys() for group in groups))
    foreign = sorted(set().union(*(group.keys() for group in saved_groups)) - own_keys)
    if foreign:
        return f"the checkpoint's optimizer is of another kind (its settings {', '.join(foreign)} are not this run's optimizer's)"
    params = [param for group in groups for param in group["params"]]
    indices = [index for group in saved_groups for index in group["params"]]
    for position, (index, param) in enumerate(zip(indices, params)):
        for name, value in saved["state"].get(index, {}).items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:
                return (f"the checkpoint's optimizer state {name} of parameter {position} has shape {tuple(value.shape)}, "
                        f"this run's parameter {tuple(param.shape)}")
    return None
