"""What the worker stores of a sampled episode for the run page's viewer (``episode_row``): the
turns as the library recorded them, token ids dropped, and a trained-token count only where the
backend reported token ids."""

from training.backends.verl.backend import rollout_row_to_episode
from training.types import Episode, Step, TerminationReason, Trajectory
from webapp.dashboard.recording import episode_row


def test_the_turns_keep_the_environments_reply_and_the_count_of_trained_tokens():
    step = Step(chat_completions=[{"role": "user", "content": "22>"}, {"role": "assistant", "content": "D"}],
                observation="22>", next_observation="32>", model_response="D", prompt_ids=[5, 6], response_ids=[7, 1])
    episode = Episode(trajectories=[Trajectory(steps=[step], reward=0.5)], termination_reason=TerminationReason.MAX_TURNS,
                      prompt_ids=[5, 6], response_ids=[7, 1], response_mask=[1, 1])

    data = episode_row(1, 3, 0, episode.to_dict()).data

    [turn] = data["trajectories"][0]["steps"]
    assert turn["next_observation"] == "32>" and turn["response_tokens"] == 2
    assert data["trained_tokens"] == 2
    assert not {"prompt_ids", "response_ids", "response_mask"} & (set(data) | set(turn))


def test_an_episode_without_token_ids_claims_no_count():
    # verl's rollout dump has the texts but no token ids: "0 tokens trained" would be false.
    episode = rollout_row_to_episode({"input": "2+3=", "output": "5", "gts": "5", "score": 1.0, "step": 2})

    data = episode_row(1, 2, 0, episode).data

    assert "trained_tokens" not in data
    [turn] = data["trajectories"][0]["steps"]
    assert turn["chat_completions"] == [{"role": "user", "content": "2+3="}] and turn["model_response"] == "5"
