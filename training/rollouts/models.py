"""Loading the policy model and tokenizer: a hub id, a local directory, or the built-in tiny model."""

from __future__ import annotations

from pathlib import Path

from training.config import Config

TINY_MODEL = "tiny-char"


def resolve_model_path(config: Config, run_path: str | Path) -> str:
    """The directory or hub id to load. ``tiny-char`` is built in code and saved under the run
    directory first, so that it loads through the same ``from_pretrained`` code as any model."""
    model = config.actor_rollout_ref.model
    if model.path is None:
        raise ValueError(
            "actor_rollout_ref.model.path: no model given; set it to a hub id, a local directory, "
            f"or '{TINY_MODEL}' for the built-in tiny model."
        )
    if model.path == TINY_MODEL:
        from training.rollouts.tiny import save_tiny_model  # brings in torch: imported on first use

        target = Path(run_path) / "base_model"
        save_tiny_model(target, layers=model.tiny_layers, hidden_size=model.tiny_hidden_size, seed=config.trainer.seed)
        return str(target)
    return model.path


def load_policy(config: Config, run_path: str | Path):
    """Load ``(model, tokenizer, path)``. Hub ids need network access; local directories do not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(config, run_path)
    model_cfg = config.actor_rollout_ref.model
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or path, trust_remote_code=model_cfg.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, model_cfg.dtype), trust_remote_code=model_cfg.trust_remote_code
        )
    except OSError as exc:
        raise ValueError(
            f"actor_rollout_ref.model.path: could not load {path!r} ({exc}). Give a local directory "
            f"holding a saved model, a reachable hub id, or '{TINY_MODEL}'."
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, path
