"""A run that trained but had nothing to learn from (its reward the same at every step) succeeds
with a warning naming the likely cause; a run whose reward moved gets none."""

import pytest

from task_rewards import PROMPTS, starts_a_to_m
from training import AgentTrainer
from training.rollouts.outcomes import ColumnReads, RewardTrace, columns_the_reward_lacks, learning_warnings
from training.rewards import RewardFunction

TINY = {
    "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 4, "data.train_batch_size": 4,
    "data.max_response_length": 4, "trainer.total_training_steps": 2, "trainer.logger": [], "trainer.cpu_threads": 1,
}


def traced(*steps: dict) -> RewardTrace:
    trace = RewardTrace()
    for step, metrics in enumerate(steps, start=1):
        trace.log_metrics(step, metrics)
    return trace


# -- the trace on its own ------------------------------------------------------------------------

def test_a_reward_of_0_at_every_step_is_named_with_its_steps():
    [warning] = learning_warnings(traced({"reward": 0.0, "reward_std": 0.0}, {"reward": 0.0, "reward_std": 0.0}), "graded")
    assert warning.startswith("reward was 0 at every step (steps 1 to 2): no episode earned any reward")
    assert "reward function graded gave 0 to every response" in warning


def test_the_same_reward_for_every_episode_is_no_learning_signal_either():
    [warning] = learning_warnings(traced({"reward": 1.0, "reward_std": 0.0}, {"reward": 1.0, "reward_std": 0.0}))
    assert warning.startswith("reward was 1 at every step (steps 1 to 2), the same for every episode")


@pytest.mark.parametrize("steps", [
    [{"reward": 0.0, "reward_std": 0.0}, {"reward": 0.25, "reward_std": 0.4}],  # it moved
    [{"reward": 0.5, "reward_std": 0.5}, {"reward": 0.5, "reward_std": 0.5}],  # the same mean, but episodes differed
    [{"reward": 0.5, "critic/score/max": 1.0, "critic/score/min": 0.0}],  # verl's spread
], ids=["moved", "spread", "verl_spread"])
def test_a_reward_that_tells_episodes_apart_gets_no_warning(steps):
    assert learning_warnings(traced(*steps)) == []


def test_validation_scores_are_not_training_steps_and_no_step_is_no_verdict():
    trace = RewardTrace()
    trace.log_metrics(0, {"val/copy/reward": 0.0})
    assert trace.steps == {} and learning_warnings(trace) == []


def test_responses_cut_at_every_step_are_named_as_a_possible_cause():
    [warning] = learning_warnings(traced({"reward": 0.0, "reward_std": 0.0, "clipped_ratio": 1.0}))
    assert "(step 1)" in warning and "every response was cut at data.max_response_length" in warning
    [warning] = learning_warnings(traced({"reward": 0.0, "reward_std": 0.0, "clipped_ratio": 1.0},
                                         {"reward": 0.0, "reward_std": 0.0, "clipped_ratio": 0.5}))
    assert "data.max_response_length" not in warning


@pytest.mark.parametrize("top, warned", [(0.0, True), (1.0, False)], ids=["flat", "spread"])
def test_verls_metrics_reach_the_trace_through_its_bridge(tmp_path, monkeypatch, top, warned):
    """What verl's Tracking file backend writes, as the verl backend forwards it to every sink."""
    from verl.utils.tracking import Tracking

    from training.backends.verl.backend import VerlMetricsBridge
    from training.tracking.sinks import MultiSink

    metrics_path = tmp_path / "verl_metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_path))
    tracking = Tracking(project_name="p", experiment_name="e", default_backend=["file"])
    trace = RewardTrace()
    bridge = VerlMetricsBridge(MultiSink([trace]), metrics_path)
    tracking.log({"val-core/copy/reward/mean@1": 0.0}, step=0)
    for step in (1, 2):
        tracking.log({"critic/score/mean": 0.0, "critic/score/max": top, "critic/score/min": 0.0}, step=step)
    bridge.poll()
    tracking.finish()
    assert sorted(trace.steps) == [1, 2]
    assert bool(learning_warnings(trace)) == warned


# -- which columns a reward looked for -------------------------------------------------------------

def test_the_columns_a_reward_looked_for_and_the_row_lacks():
    def reads_answer(task, response):
        return float(response == task.get("answer")) + ("difficulty" in task)

    def trl_style(completions, prompts, answer=None, **kwargs):
        return [0.0 for _ in completions]

    row = {"question": "x=", "solution": "a"}
    for fn, lacks in ((reads_answer, ["answer", "difficulty"]), (trl_style, ["answer"]),
                      (lambda data_source, solution_str, ground_truth, extra_info: 0.0, [])):
        reward = RewardFunction(fn, answer_key="solution", prompt_key="question")
        reads = ColumnReads(row)
        reward.probe(reads)
        assert columns_the_reward_lacks(reward, reads) == lacks, fn
    reads = ColumnReads(row)
    RewardFunction(lambda task, response: task["question"] and 0.0).probe(reads)
    assert reads.missing == []  # a column the row has is not noted


# -- real training on the tiny model ---------------------------------------------------------------

def test_a_trl_run_whose_reward_is_always_0_succeeds_with_the_warning(tmp_path, caplog):
    result = AgentTrainer(train_dataset=PROMPTS, reward_func=lambda task, response: 0.0, backend="trl",
                          run_path=str(tmp_path), config=TINY).train()
    assert result.steps == 2 and len(result.warnings) == 1
    assert result.warnings[0].startswith("reward was 0 at every step (steps 1 to 2)")
    assert result.warnings[0] in caplog.text  # logged too: the run's log says it


def test_a_reward_reading_a_column_the_csv_lacks_is_named_with_the_fix(tmp_path):
    csv = tmp_path / "tasks.csv"
    csv.write_text("question,solution\nx=,a\ny=,b\nz=,c\nw=,d\n")

    def graded(task, response):  # the column is 'solution': task.get("answer") is always None
        return float(response.strip() == task.get("answer"))

    config = {**TINY, "data.prompt_key": "question", "data.answer_key": "solution"}
    result = AgentTrainer(train_dataset=str(csv), reward_func=graded, backend="trl", run_path=str(tmp_path / "run"),
                          config=config).train()
    [warning] = result.warnings
    assert warning.startswith("reward was 0 at every step")
    assert "reward function graded looked for column(s) 'answer', which train_dataset does not have (its columns: question, solution)" in warning
    assert "Have the reward read task['solution'], or rename the column 'solution' to 'answer'." in warning


def test_a_run_whose_reward_moved_gets_no_warning(tmp_path, sink):
    result = AgentTrainer(train_dataset=PROMPTS, reward_func=starts_a_to_m, backend="trl", run_path=str(tmp_path),
                          config=TINY, sinks=[sink]).train()
    assert result.steps == 2 and result.warnings == []
    assert any(m["reward_std"] > 0 for m in sink.metrics if "reward_std" in m)  # the reward did tell episodes apart


def test_a_stopped_run_is_not_judged(tmp_path):
    result = AgentTrainer(train_dataset=PROMPTS, reward_func=lambda task, response: 0.0, backend="trl",
                          run_path=str(tmp_path), config=TINY, should_stop=lambda: True).train()
    assert result.stopped and result.warnings == []
