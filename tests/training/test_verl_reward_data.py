"""Reward adapter, parquet conversion and the metrics bridge, each checked against verl's own code:
verl's dataset reads our parquet, verl's loader calls our reward function, and verl's Tracking
writes the file our bridge reads."""

import json

import pytest
from omegaconf import OmegaConf

from training.backends.verl.backend import (
    REWARD_MODULE,
    VerlMetricsBridge,
    reward_kwargs_for,
    task_from_extra_info,
    verl_reward_function,
    write_verl_parquet,
)
from training.rewards import load_reward
from training.tracking.sinks import MultiSink
from training.rollouts.tiny import build_char_tokenizer

TASKS = [
    {"prompt": "2+3=", "ground_truth": "5", "nums": [2, 3], "meta": {"level": 1}},
    {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "7*6="}], "ground_truth": 42},
]


def test_parquet_round_trips_through_verls_dataset(tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = write_verl_parquet(TASKS, tmp_path / "train.parquet", agent_name="agent_trainer")
    data_config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 64, "filter_overlong_prompts": False})
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=build_char_tokenizer(), config=data_config, processor=None)

    assert len(dataset) == 2
    first, second = dataset[0], dataset[1]
    assert first["raw_prompt"] == [{"role": "user", "content": "2+3="}]
    assert second["raw_prompt"] == TASKS[1]["prompt"]
    assert first["agent_name"] == "agent_trainer" and first["data_source"] == "agent_trainer"
    assert first["reward_model"] == {"style": "rule", "ground_truth": "5"}
    assert second["reward_model"]["ground_truth"] == "42"
    assert (first["index"], second["index"]) == (0, 1)
    # The whole task comes back unchanged, types included.
    assert task_from_extra_info(first["extra_info"]) == TASKS[0]
    assert task_from_extra_info(second["extra_info"]) == TASKS[1]


def test_reward_adapter_has_verls_signature():
    compute_score = verl_reward_function(load_reward("math"))
    # Called the way verl's naive reward manager calls it.
    right = compute_score(data_source="gsm8k", solution_str="so \\boxed{42}", ground_truth="42", extra_info={})
    wrong = compute_score(data_source="gsm8k", solution_str="41", ground_truth="42", extra_info=None)
    assert right == {"score": 1.0, "acc": 1.0}
    assert wrong == {"score": 0.0, "acc": 0.0}


def test_rllm_style_reward_sees_the_whole_task():
    seen = {}

    def uses_nums(task, response):
        seen.update(task)
        return float(response == str(sum(task["nums"])))

    compute_score = verl_reward_function(load_reward(uses_nums))
    extra_info = {"task": json.dumps(TASKS[0]), "num_turns": 2}  # as our parquet row plus what verl adds
    assert compute_score("agent_trainer", "5", "5", extra_info) == {"score": 1.0, "acc": 1.0}
    assert seen["nums"] == [2, 3] and seen["meta"] == {"level": 1}


@pytest.mark.parametrize("spec", ["exact_match", lambda task, response: float(response.strip() == task["ground_truth"])])
def test_verl_loads_our_reward_through_its_custom_reward_function(spec):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    reward = load_reward(spec)
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": REWARD_MODULE,
                    "name": "compute_score",
                    "reward_kwargs": reward_kwargs_for(spec if isinstance(spec, str) else reward, "ground_truth"),
                }
            }
        }
    )
    compute_score = get_custom_reward_fn(config)
    extra_info = {"task": json.dumps(TASKS[0])}
    assert compute_score(data_source="d", solution_str="5", ground_truth="5", extra_info=extra_info)["score"] == 1.0
    assert compute_score(data_source="d", solution_str="6", ground_truth="5", extra_info=extra_info)["score"] == 0.0


def test_metrics_bridge_reads_verls_tracking_file(tmp_path, monkeypatch, sink):
    from verl.utils.tracking import Tracking

    metrics_path = tmp_path / "verl_metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_path))
    tracking = Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    bridge = VerlMetricsBridge(MultiSink([sink]), metrics_path, rollout_dir=tmp_path / "rollouts")

    tracking.log({"critic/score/mean": 0.25, "actor/pg_loss": -0.1, "timing_s/step": 3.0, "note": "text"}, step=1)
    assert bridge.poll() == 1
    with open(metrics_path, "ab") as handle:  # a torn or foreign line is skipped, not fatal
        handle.write(b"not json\n")
    tracking.log({"critic/score/mean": 0.75, "actor/ppo_kl": 0.02, "response_length/mean": 12}, step=2)
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "2.jsonl").write_text(
        json.dumps({"input": "2+3=", "output": "5", "gts": "5", "score": 1.0, "step": 2}) + "\n"
    )
    assert bridge.poll() == 1
    tracking.finish()

    first, second = sink.metrics
    assert first["step"] == 1 and first["reward"] == 0.25 and first["loss"] == -0.1 and first["step_time"] == 3.0
    assert first["critic/score/mean"] == 0.25 and "note" not in first
    assert second["step"] == 2 and second["reward"] == 0.75 and second["kl"] == 0.02 and second["response_length"] == 12
    episodes = sink.episodes
    assert len(episodes) == 1 and episodes[0]["reward"] == 1.0 and episodes[0]["is_correct"] is True
    [turn] = episodes[0]["trajectories"][0]["steps"]
    assert turn["model_response"] == "5" and turn["chat_completions"] == [{"role": "user", "content": "2+3="}]
    assert bridge.poll() == 0  # nothing new, nothing sent twice
    assert len(sink.metrics) == 1 + 1 and len(sink.episodes) == 1


def test_metrics_bridge_fails_a_step_whose_dumped_episodes_mostly_errored(tmp_path, sink):
    from training.rollouts.outcomes import OutcomeMonitor
    from training.errors import TooManyEpisodeErrors

    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    metrics_path = tmp_path / "verl_metrics.jsonl"
    metrics_path.write_text(json.dumps({"step": 1, "data": {"critic/score/mean": 0.0}}) + "\n")
    trace = "Traceback (most recent call last):\n  File \"agent.py\", line 9, in step\nTypeError: bad\n"
    rows = [{"input": "go>", "output": "a", "gts": "", "score": 0.0, "step": 1, "acc": 0.0,
             "termination_reason": end, "error": "TypeError: bad" if end == "error" else "",
             "traceback": trace if end == "error" else ""} for end in ("error", "error", "error", "env_done")]
    (rollouts / "1.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    bridge = VerlMetricsBridge(MultiSink([sink]), metrics_path, rollout_dir=rollouts, outcomes=OutcomeMonitor(0.5))

    bridge.poll()
    assert isinstance(bridge.failure, TooManyEpisodeErrors)
    assert bridge.failure.summary.startswith("3 of 4 episodes in step 1 ended with an error")
    assert bridge.failure.user_traceback.endswith("TypeError: bad")
    assert sink.episodes[0]["termination_reason"] == "error" and sink.episodes[0]["error"] == "TypeError: bad"
