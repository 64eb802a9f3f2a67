"""A run says what happened: failed episodes, a reward that raises or never runs, and zero steps
are failures naming their cause, never a success."""

from pathlib import Path

import pytest

import examples  # noqa: F401  (registers the example datasets)
from training import AgentTrainer
from training.rollouts.outcomes import NoStepsTrained, OutcomeMonitor, RewardFailed, RewardNeverRan
from training.errors import TooManyEpisodeErrors
from training.types import Episode, TerminationReason

MISPORTED_AGENT = str(Path(__file__).resolve().parents[1] / "fixtures" / "misported_agent.py") + ":MisportedAgent"
TINY = {
    "actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 2, "data.train_batch_size": 2,
    "data.max_response_length": 8, "rllm.agent.max_steps": 2, "rllm.agent.max_tokens_per_turn": 1,
    "trainer.total_training_steps": 2, "trainer.logger": [], "trainer.cpu_threads": 1,
}


def episodes(*ends: str) -> list[Episode]:
    made = []
    for end in ends:
        episode = Episode(termination_reason=TerminationReason(end))
        if end == "error":
            episode.error = "TypeError: boom"
            episode.info["traceback"] = "Traceback (most recent call last):\n  File \"agent.py\", line 3\nTypeError: boom\n"
        made.append(episode)
    return made


# -- the monitor on its own ----------------------------------------------------------------------

def test_error_rate_at_the_limit_passes_and_above_it_fails():
    monitor = OutcomeMonitor(max_episode_error_rate=0.5)
    monitor.check_episodes(episodes("error", "error", "env_done", "max_turns"), step=1)
    with pytest.raises(TooManyEpisodeErrors) as failed:
        monitor.check_episodes([e.to_dict() for e in episodes("error", "error", "error", "env_done")], step=2)
    assert failed.value.summary == (
        "3 of 4 episodes in step 2 ended with an error (more than trainer.max_episode_error_rate=0.5 of them). "
        "The first failed episode raised TypeError: boom."
    )
    assert failed.value.user_traceback.endswith("TypeError: boom") and "agent.py" in str(failed.value)


def test_zero_steps_and_no_scored_episode_are_failures_but_a_stop_is_not_judged():
    monitor = OutcomeMonitor(max_episode_error_rate=1.0)
    with pytest.raises(NoStepsTrained, match="training ended after 0 steps.* The set has 1 row"):
        monitor.check_finished(0, hint="The set has 1 row.")
    monitor.check_episodes(episodes("max_prompt_length", "error"), step=1)
    with pytest.raises(RewardNeverRan, match=r"none of the episodes of 3 step\(s\) was scored \(their ends: max_prompt_length 1, error 1\)"):
        monitor.check_finished(3)
    monitor.check_finished(0, stopped=True)


def test_a_required_reward_that_was_never_called_fails_the_run():
    monitor = OutcomeMonitor(max_episode_error_rate=0.5)
    monitor.watch_reward(lambda task, response: 1.0, required=True)
    with pytest.raises(RewardNeverRan, match="reward function <lambda> was never called in 2 step"):
        monitor.check_finished(2)


# -- real training on the tiny model ---------------------------------------------------------------

def test_every_episode_raising_fails_the_run_with_the_count_and_the_traceback(tmp_path, sink):
    trainer = AgentTrainer(agent_class=MISPORTED_AGENT, env_class="examples.frozenlake.FrozenLakeEnv",
                           train_dataset="frozenlake:train", backend="trl", run_path=str(tmp_path), config=TINY,
                           sinks=[sink])
    with pytest.raises(TooManyEpisodeErrors) as failed:
        trainer.train()
    assert failed.value.summary.startswith("4 of 4 episodes in step 1 ended with an error")
    assert "TypeError: Step.__init__() got an unexpected keyword argument 'confidence_score'" in failed.value.summary
    assert "misported_agent.py" in failed.value.user_traceback  # the user's own line, not TRL's frames
    assert sink.episodes and sink.episodes[0]["termination_reason"] == "error"  # the failed episodes stay visible
    assert not (tmp_path / "final_model").exists()


def picky(task, response):
    """Passes the construction probe (row 0) and raises on row 1."""
    if task["prompt"] == "y=":
        raise KeyError("answer")
    return 0.0


@pytest.mark.parametrize("agent", [{}, {"agent_run_func": lambda task, model: None}], ids=["single_turn", "run_func"])
def test_a_reward_that_raises_mid_training_names_itself_the_row_and_the_step(tmp_path, agent):
    trainer = AgentTrainer(train_dataset=[{"prompt": "x="}, {"prompt": "y="}], reward_func=picky, backend="trl",
                           run_path=str(tmp_path), config=TINY, **agent)
    with pytest.raises(RewardFailed) as failed:
        trainer.train()
    assert failed.value.summary.startswith(
        "reward function picky raised KeyError: 'answer' on row 1 of train_dataset {'prompt': 'y='} in step 1"
    )
    assert 'raise KeyError("answer")' in failed.value.user_traceback


def test_a_run_whose_episodes_are_never_scored_fails(tmp_path):
    config = {**TINY, "data.max_prompt_length": 1}  # every first prompt is too long: no episode reaches its reward
    trainer = AgentTrainer(agent_class="examples.frozenlake.FrozenLakeAgent", env_class="examples.frozenlake.FrozenLakeEnv",
                           train_dataset="frozenlake:train", backend="trl", run_path=str(tmp_path), config=config)
    with pytest.raises(RewardNeverRan, match=r"none of the episodes of 2 step\(s\) was scored \(their ends: max_prompt_length 8\)"):
        trainer.train()


def test_a_run_that_fails_before_training_starts_still_tells_and_closes_its_sinks(tmp_path, monkeypatch, sink):
    """The backend never reaches its own ``with self.sinks`` (the model does not load): the sinks are
    told the run failed and closed once, so a tracker's run does not stay "running" and a sink's
    thread does not outlive the run."""
    from training.backends.trl import backend as trl_backend

    def no_model(config, run_path):
        raise OSError("the model's weights could not be read")

    trainer = AgentTrainer(train_dataset=[{"prompt": "x="}, {"prompt": "y="}], reward_func=lambda task, response: 0.0,
                           backend="trl", run_path=str(tmp_path), config=TINY, sinks=[sink])
    monkeypatch.setattr(trl_backend, "load_policy", no_model)
    with pytest.raises(OSError, match="could not be read"):
        trainer.train()
    assert sink.outcomes == [("failed", "OSError: the model's weights could not be read")] and sink.closes == 1


def test_a_processor_of_the_users_own_that_never_closes_its_sinks_has_them_closed(tmp_path, sink):
    """A registered processor (AWorld's ``TrainerProcessor`` contract) that returns without closing
    the sinks it was given: their last batch written and their threads ended with the run."""
    from training import register_processor, unregister_processor
    from training.backends.base import BuiltinProcessor, TrainResult

    class Forgetful(BuiltinProcessor):
        def train(self):
            self.sinks.log_metrics(1, {"reward": 1.0})
            return TrainResult(run_path=self.run_path, steps=1)

    register_processor("forgetful", Forgetful)
    try:
        AgentTrainer(train_dataset=[{"prompt": "x="}, {"prompt": "y="}], reward_func=lambda task, response: 0.0, backend="forgetful",
                     run_path=str(tmp_path), config=TINY, sinks=[sink]).train()
    finally:
        unregister_processor("forgetful")
    assert sink.closes == 1 and sink.outcomes == [] and sink.metrics == [{"step": 1, "reward": 1.0}]
