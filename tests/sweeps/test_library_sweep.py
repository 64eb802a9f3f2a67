"""``training.platform.sweep``: a sweep from the library, Optuna sampling and pruning; no platform."""

from __future__ import annotations

import json

import pytest

from training.errors import ConfigError
from training.platform.sweep import TrialRecord, parse_space, should_prune, sweep


def test_a_grid_sweep_trains_each_point_and_scores_it_with_the_last_reward(tmp_path):
    import examples  # noqa: F401  (registers the copy dataset)

    study = sweep(
        {"train_dataset": "copy:train", "reward_func": "char_accuracy", "backend": "trl", "run_path": str(tmp_path),
         "config": {"actor_rollout_ref.model.path": "tiny-char", "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
                    "data.max_response_length": 4, "trainer.total_training_steps": 1, "trainer.logger": ["jsonl"],
                    "trainer.system_metrics_interval": 0}},
        space={"actor_rollout_ref.actor.optim.lr": "choice 0.01, 0.001"}, n_trials=5, sampler="grid", prune=False,
    )
    assert len(study.trials) == 2  # the grid has two points, whatever n_trials says
    assert sorted(t.params["actor_rollout_ref.actor.optim.lr"] for t in study.trials) == [0.001, 0.01]
    for trial in study.trials:
        rows = [json.loads(line) for line in (tmp_path / f"trial-{trial.number}" / "metrics.jsonl").read_text().splitlines()]
        config = (tmp_path / f"trial-{trial.number}" / "config.yaml").read_text()
        assert trial.value == pytest.approx([r["reward"] for r in rows if "reward" in r][-1])
        assert f"lr: {trial.params['actor_rollout_ref.actor.optim.lr']}" in config


def test_spaces_are_parsed_and_bad_ones_named():
    space = parse_space("data.train_batch_size: choice 2, 4\nactor_rollout_ref.actor.optim.lr: float 1e-4..1e-2 log\nactor_rollout_ref.rollout.n: int 2..8")
    assert space["data.train_batch_size"].choices == (2, 4)
    assert space["actor_rollout_ref.actor.optim.lr"].log and space["actor_rollout_ref.rollout.n"].high == 8
    with pytest.raises(ConfigError, match="data.batch: not a config key"):
        parse_space({"data.batch": "choice 1"})
    with pytest.raises(ConfigError, match=r"expected 'float low..high'"):
        parse_space({"actor_rollout_ref.actor.optim.lr": "float 1e-4"})


def test_the_median_pruner_stops_a_trial_behind_the_completed_ones():
    space = parse_space({"actor_rollout_ref.actor.optim.lr": "float 1e-4..1e-2"})
    done = [TrialRecord(params={"actor_rollout_ref.actor.optim.lr": 1e-3}, state="complete", value=0.9,
                        intermediate={1: 0.5, 2: 0.7, 3: 0.9}) for _ in range(2)]
    behind = TrialRecord(params={"actor_rollout_ref.actor.optim.lr": 1e-2}, intermediate={1: 0.1, 2: 0.1})
    ahead = TrialRecord(params={"actor_rollout_ref.actor.optim.lr": 1e-2}, intermediate={1: 0.6, 2: 0.8})
    assert should_prune(space, "maximize", done, behind) and not should_prune(space, "maximize", done, ahead)
    assert not should_prune(space, "maximize", done[:1], behind)  # too few completed trials to judge
