"""The registry rows for the examples in ``examples/`` (idempotent: re-seeding updates them)."""

from __future__ import annotations

from webapp.registry.models import Agent, Backend, Dataset, RewardFunction, Tool

TOOLS = [
    {"name": "add", "path": "examples.arithmetic.add", "description": "Add two numbers."},
    {"name": "multiply", "path": "examples.arithmetic.multiply", "description": "Multiply two numbers."},
]
AGENTS = [
    {"name": "frozenlake", "description": "Multi-turn grid world (examples.frozenlake).",
     "agent_class": "examples.frozenlake.FrozenLakeAgent", "env_class": "examples.frozenlake.FrozenLakeEnv"},
    {"name": "copy-task", "description": "Single-turn: copy the prompt (examples.copy_task)."},
    {"name": "countdown", "description": "A workflow agent (examples.countdown_workflow).",
     "workflow_class": "examples.countdown_workflow.CountdownWorkflow"},
    {"name": "calculator", "description": "A chat agent with calculator tools, defined without code (examples/agents/calculator.yaml).",
     "system_prompt": "You are a careful calculator. Use the tools, then answer with the number alone.",
     "llm_config": {"llm_temperature": 1.0}, "tools": ["add", "multiply"]},
]
DATASETS = [
    {"name": "frozenlake", "source": Dataset.Source.REGISTERED, "identifier": "frozenlake", "val_split": "test"},
    {"name": "copy", "source": Dataset.Source.REGISTERED, "identifier": "copy", "val_split": "test"},
    {"name": "countdown", "source": Dataset.Source.REGISTERED, "identifier": "countdown", "val_split": "test"},
    {"name": "arithmetic", "source": Dataset.Source.REGISTERED, "identifier": "arithmetic", "val_split": "test"},
]
REWARDS = [
    {"name": "exact-match", "path": "exact_match", "description": "1 when the answer equals ground_truth."},
    {"name": "char-accuracy", "path": "char_accuracy", "description": "Share of characters in the right place."},
    {"name": "countdown", "path": "countdown", "description": "Countdown score of an arithmetic expression."},
    {"name": "math", "path": "math", "description": "1 when the answer's last number equals ground_truth."},
]
BACKENDS = [
    {"name": "trl", "processor": "trl", "queue": "cpu", "needs_gpu": False, "enabled": True,
     "default_config": {}, "max_concurrent_runs": 0},
    {"name": "verl", "processor": "verl", "queue": "gpu", "needs_gpu": True, "enabled": False,
     "default_config": {}, "max_concurrent_runs": 0},
    # Remote services: the GPUs are theirs, so a CPU worker drives them (it needs the API key).
    {"name": "tinker", "processor": "tinker", "queue": "cpu", "needs_gpu": False, "enabled": True,
     "default_config": {}, "max_concurrent_runs": 0},
    {"name": "fireworks", "processor": "fireworks", "queue": "cpu", "needs_gpu": False, "enabled": True,
     "default_config": {}, "max_concurrent_runs": 0},
    # ms-swift trains in its own environment (make swift-env); the training process runs there.
    {"name": "swift", "processor": "swift", "queue": "cpu", "needs_gpu": False, "enabled": True,
     "default_config": {}, "max_concurrent_runs": 0, "python": ".venv-swift/bin/python"},
]

# A run small enough to finish in a minute or two on a laptop CPU (one torch thread: a tiny model
# on a few shared cores runs several times faster so; 16 test rows scored before the first step).
DEMO_RUN = {
    "agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl", "model": "tiny-char",
    "overrides": "trainer.total_training_steps=20\ndata.train_batch_size=4\nactor_rollout_ref.rollout.n=4\n"
                 "trainer.cpu_threads=1\ndata.val_batch_size=16\n",
}


def seed_registry(enable_gpu_backends: bool = False) -> dict[str, int]:
    """Create or update the example rows. Backends keep an admin's later changes (only created here)."""
    counts = {}
    for model, rows in ((Tool, TOOLS), (Agent, AGENTS), (Dataset, DATASETS), (RewardFunction, REWARDS)):
        for row in rows:
            defaults = {k: v for k, v in row.items() if k not in ("name", "tools")}
            entry, _ = model.objects.update_or_create(name=row["name"], defaults=defaults)
            if "tools" in row:
                entry.tools.set(Tool.objects.filter(name__in=row["tools"]))
        counts[model.__name__] = len(rows)
    for row in BACKENDS:
        defaults = {k: v for k, v in row.items() if k != "name"}
        if row["needs_gpu"] and enable_gpu_backends:
            defaults["enabled"] = True
        Backend.objects.get_or_create(name=row["name"], defaults=defaults)
    counts["Backend"] = len(BACKENDS)
    return counts
