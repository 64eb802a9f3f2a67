"""Command line: ``python -m training train <run.yaml> [--set key=value ...]`` and ``python -m training demo``.

A run file names the agent, datasets, reward, backend, run path and config overrides; see
``examples/configs/``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from training.tracking.sinks import ConsoleSink
from training.config import TrainerConfig, parse_overrides
from training.errors import TrainingFailed

RUN_FILE_KEYS = {"agent", "train_dataset", "val_dataset", "reward_func", "backend", "run_path", "config"}


class ProgressSink:
    """A progress bar over training steps, with the console's one-line summary written above it. The
    bar is drawn from ``start()`` (once the run is built and checked: a refused config shows its
    error alone, not an empty bar above it) or the first step logged."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Any = None
        self.line = ConsoleSink(total)
        self.last_step = 0

    def start(self) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=self.total, unit="step", dynamic_ncols=True)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.start()
        self.bar.update(step - self.last_step)
        self.last_step = step
        if "reward" in metrics:
            self.bar.set_postfix(reward=f"{metrics['reward']:.3f}")
        shown = " ".join(f"{k}={metrics[k]:.4g}" for k in ConsoleSink.HEADLINE if k in metrics)
        if shown:  # validation scores alone are logged by the backend itself
            self.bar.write(f"step {step}/{self.line.total_steps} {shown}")

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RewardTarget:
    """Stops training once the mean reward of the last ``window`` logged steps reaches ``target``."""

    def __init__(self, target: float, window: int = 5) -> None:
        self.target, self.window = target, window
        self.rewards: list[float] = []
        self.reached_at: float | None = None
        self.started = time.perf_counter()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if "reward" in metrics:
            self.rewards.append(metrics["reward"])
            recent = self.rewards[-self.window:]
            if self.reached_at is None and len(recent) == self.window and sum(recent) / self.window >= self.target:
                self.reached_at = time.perf_counter() - self.started

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass

    def reached(self) -> bool:
        return self.reached_at is not None


def demo_run_file() -> Path:
    """The multi-turn grid world's run file, shipped with the examples (in a checkout or an installed wheel)."""
    import examples

    return Path(examples.__file__).resolve().parent / "configs" / "frozenlake.yaml"


def load_run_file(path: str | Path, overrides: list[str]) -> dict[str, Any]:
    """Read a run file; ``overrides`` (``key=value``) are added to its ``config`` section."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    unknown = set(data) - RUN_FILE_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {sorted(unknown)}; a run file may hold {sorted(RUN_FILE_KEYS)}.")
    config = data.get("config") or {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected key=value.")
        config[key.strip()] = yaml.safe_load(value)
    data["config"] = config
    return data


def without_console_logger(config: dict[str, Any]) -> dict[str, Any]:
    """The run's config as flat keys with ``console`` taken out of ``trainer.logger``: the progress
    bar prints those lines here. Every other logger the user named (wandb, mlflow, ...) stays."""
    flat = parse_overrides(config)
    names = flat.get("trainer.logger", TrainerConfig().logger)
    if isinstance(names, (list, tuple)):  # anything else is the config check's to refuse
        flat["trainer.logger"] = [name for name in names if name != "console"]
    return flat


def build_trainer(run: dict[str, Any], sinks: list, should_stop=None):
    import examples  # noqa: F401  (registers the example datasets, so run files can name them)
    from training import AgentTrainer  # imports the whole library

    return AgentTrainer(
        agent=run.get("agent"),
        train_dataset=run.get("train_dataset"),
        test_dataset=run.get("val_dataset"),
        reward_func=run.get("reward_func"),
        config=run.get("config"),
        backend=run.get("backend"),
        run_path=run.get("run_path", "runs"),
        sinks=sinks,
        should_stop=should_stop,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description="Train an LLM agent with RL.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a run file")
    train.add_argument("run_file")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--run-path", help="output directory (default: the run file's run_path)")
    demo = sub.add_parser("demo", help="train the multi-turn grid world until its reward passes 0.9")
    demo.add_argument("--target", type=float, default=0.9)
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("training").setLevel(logging.INFO)
    run_file = demo_run_file() if args.command == "demo" else args.run_file
    sinks: list = []
    try:
        run = load_run_file(run_file, args.overrides)
        run["config"] = without_console_logger(run["config"])
        if getattr(args, "run_path", None):
            run["run_path"] = args.run_path
        if args.command == "demo":
            run["config"].setdefault("trainer.resume_mode", "disable")
            # The process id as well: two demos started in the same second must not share a folder.
            run["run_path"] = f"{run.get('run_path', 'runs/demo')}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        total = int(run["config"].get("trainer.total_training_steps", 100))
        target = RewardTarget(args.target) if args.command == "demo" else None
        sinks = [ProgressSink(total)] + ([target] if target else [])
        trainer = build_trainer(run, sinks, should_stop=target.reached if target else None)
    except ValueError as exc:
        for sink in sinks:  # the progress bar goes before the message
            sink.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2

    sinks[0].start()
    started = time.perf_counter()
    try:
        result = trainer.train()
    except TrainingFailed as exc:  # the run did not succeed; its message names why
        print(f"error: the run failed: {exc}", file=sys.stderr)
        print(f"training failed: {sinks[0].last_step} of {total} steps, status failed (the error above says why)")
        return 1
    except ValueError as exc:  # bad input found only once training started (e.g. the model)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    reward = result.metrics.get("reward", float("nan"))
    warnings = getattr(result, "warnings", None) or []
    code = 0
    if target is not None and target.reached():
        outcome = f"finished: {result.steps} steps, status succeeded (reward passed {args.target} after {target.reached_at:.1f}s of training)"
    elif target is not None:
        outcome = f"ended: {result.steps} steps, status target not reached (reward did not pass {args.target})"
        code = 1
    elif result.stopped:
        outcome = f"stopped: {result.steps} of {total} steps, status stopped on request"
    else:
        outcome = f"finished: {result.steps} steps, status succeeded"
    if warnings:  # trained, but learnt nothing: not a failure, but not to be read as a success either
        outcome += f", but it learnt nothing ({len(warnings)} warning{'s' if len(warnings) > 1 else ''} below)"
    print(f"training {outcome}; {elapsed:.1f}s, last reward {reward:.3f}, run directory {result.run_path}")
    for warning in warnings:  # said last: the one thing to read
        print(f"warning: {warning}")
    return code
