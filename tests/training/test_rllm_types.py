"""rLLM's data classes carry over: every field of rLLM's Step, Trajectory, Episode, Action and
ModelOutput (v0.2.1.post1) is accepted, serialised and read back, and rLLM's termination names work."""

from __future__ import annotations

import dataclasses
import json

from training import Action, Episode, ModelOutput, Step, TerminationReason, Trajectory

# The fields of rLLM's classes at v0.2.1.post1 (rllm/agents/agent.py, rllm/engine/rollout/rollout_engine.py).
RLLM_FIELDS = {
    Step: {
        "prompt_ids", "response_ids", "logprobs", "chat_completions", "observation", "thought", "action",
        "model_response", "model_output", "info", "reward", "done", "mc_return",
    },
    Action: {"action"},
    Trajectory: {"uid", "name", "task", "steps", "reward", "info"},
    Episode: {"id", "task", "termination_reason", "is_correct", "trajectories", "metrics", "info"},
    ModelOutput: {
        "text", "content", "reasoning", "tool_calls", "prompt_ids", "completion_ids", "multi_modal_inputs",
        "logprobs", "prompt_length", "completion_length", "finish_reason",
    },
}


def test_every_rllm_field_exists_with_a_default():
    for cls, names in RLLM_FIELDS.items():
        ours = {f.name for f in dataclasses.fields(cls)}
        assert names <= ours, f"{cls.__name__} lacks {sorted(names - ours)}"
        cls()  # rLLM builds each of them with no arguments


def test_a_step_as_rllm_agents_build_it():
    # rLLM's FrozenLakeAgent: Step(chat_completions=..., thought=..., action=..., model_response=..., observation=...)
    step = Step(chat_completions=[{"role": "user", "content": "go"}], thought="left is safe", action="1",
                model_response="```Left```", observation="P _ G")
    assert (step.thought, step.mc_return, step.model_output) == ("left is safe", 0.0, None)


def test_episode_round_trip_through_json_keeps_model_output_and_rllm_names():
    output = ModelOutput(text="<think>hm</think>4", content="4", reasoning="hm", prompt_ids=[1, 2],
                         completion_ids=[3], logprobs=[-0.5], finish_reason="stop")
    step = Step(thought="hm", action=Action("4"), model_output=output, reward=1.0, mc_return=1.0)
    trajectory = Trajectory(name="solver", task={"question": "2+2", "images": ["<bytes>"]}, steps=[step], reward=1.0)
    episode = Episode(id="t:0", task={"question": "2+2"}, trajectories=[trajectory],
                      termination_reason=TerminationReason.MAX_TURNS_EXCEEDED, is_correct=True)
    data = json.loads(json.dumps(episode.to_dict()))
    assert data["termination_reason"] == "max_turns"
    assert data["trajectories"][0]["task"] == {"question": "2+2"}  # image payloads left out, as rLLM does
    assert data["trajectories"][0]["steps"][0]["action"] == "4"
    back = Episode.from_dict(data)
    assert back.trajectories[0].steps[0].model_output == output
    assert back.trajectories[0].uid == trajectory.uid and back.trajectories[0].name == "solver"
    assert back.termination_reason is TerminationReason.MAX_TURNS


def test_rllm_termination_names_and_stored_values():
    assert TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED is TerminationReason.MAX_PROMPT_LENGTH
    assert TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED is TerminationReason.MAX_RESPONSE_LENGTH
    assert TerminationReason("max_turns_exceeded") is TerminationReason.MAX_TURNS  # as rLLM stores it
    assert TerminationReason.UNKNOWN.value == "unknown"
    # An rLLM episode dict without a reason reads back as unknown, as in rLLM.
    assert Episode.from_dict({"id": "x", "trajectories": []}).termination_reason is TerminationReason.UNKNOWN


def test_trajectories_get_distinct_uids_and_say_whether_they_are_cumulative():
    assert Trajectory().uid != Trajectory().uid
    first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    growing = Trajectory(steps=[Step(chat_completions=first), Step(chat_completions=first + [{"role": "user", "content": "c"}])])
    restarted = Trajectory(steps=[Step(chat_completions=first), Step(chat_completions=[{"role": "user", "content": "z"}])])
    assert growing.is_cumulative() and not restarted.is_cumulative()
