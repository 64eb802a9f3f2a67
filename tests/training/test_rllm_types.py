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


# The fields rLLM's main branch added (rllm/types.py at main, 9beb6e0): its cookbooks build these.
RLLM_MAIN_FIELDS = {
    Step: {"id", "input", "output", "metadata", "advantage", "weight_version", "routing_matrices"},
    Trajectory: {"input", "output", "signals", "metadata"},
    Episode: {"session_id", "artifacts", "metadata"},
}


def test_every_field_of_rllms_main_branch_exists_with_a_default():
    for cls, names in RLLM_MAIN_FIELDS.items():
        ours = {f.name for f in dataclasses.fields(cls)}
        assert names <= ours, f"{cls.__name__} lacks {sorted(names - ours)}"
    assert Step().id != Step().id and Step().advantage is None and Step().weight_version is None


def test_metadata_is_the_same_dict_as_info_as_on_rllms_main_branch():
    step = Step(metadata={"turn": 1})
    assert step.info == {"turn": 1} and step.metadata is step.info
    step.info["seen"] = True
    assert step.metadata == {"turn": 1, "seen": True}
    step.metadata = {"other": 2}
    assert step.info == {"other": 2}
    episode = Episode(info={"a": 1})  # the v0.2.1.post1 name still sets it
    assert episode.metadata == {"a": 1}
    assert Trajectory(metadata={"k": "v"}).info == {"k": "v"}


def test_the_new_fields_survive_json_and_metadata_is_written_once_as_info():
    step = Step(model_response="\\boxed{7}", metadata={"turn": 0}, advantage=0.5, weight_version=3)
    trajectory = Trajectory(name="math", steps=[step], signals={"accuracy": 1.0})
    episode = Episode(trajectories=[trajectory], artifacts={"answer": "\\boxed{7}", "won": True}, session_id="s1")
    data = json.loads(json.dumps(episode.to_dict()))
    assert "metadata" not in data and "metadata" not in data["trajectories"][0]["steps"][0]
    back = Episode.from_dict(data)
    assert back.artifacts == {"answer": "\\boxed{7}", "won": True} and back.session_id == "s1"
    assert back.trajectories[0].signals == {"accuracy": 1.0}
    [back_step] = back.trajectories[0].steps
    assert (back_step.id, back_step.metadata, back_step.advantage, back_step.weight_version) == (step.id, {"turn": 0}, 0.5, 3)


def test_rllms_main_branch_types_and_agent_config_next_to_aworlds():
    import training
    from training.types import AgentConfig, AgentFlow, EvalOutput, Evaluator, Signal, Task, TrajectoryGroup

    task = Task(id="t1", instruction="2+5=", metadata={"ground_truth": "7"})
    assert task.task_dir == task.dataset_dir and task.metadata["ground_truth"] == "7"
    group = TrajectoryGroup(trajectories=[Trajectory()], group_id="t1:solver")
    assert (group.task_id, group.group_role) == ("t1", "solver")
    config = AgentConfig(base_url="http://127.0.0.1:1/v1", model="m", session_uid="u")
    assert config.is_validation is False and config.sampling_params == {}
    # training.AgentConfig stays AWorld's agent config; rLLM's is training.types.AgentConfig.
    assert training.AgentConfig is not AgentConfig and training.AgentConfig.__module__ == "training.compat.aworld.agents"
    assert EvalOutput(reward=1.0, is_correct=True, signals=[Signal("accuracy", 1.0)]).signals[0].value == 1.0

    class Flow:
        def run(self, task, config):
            return None

    class Scorer:
        def evaluate(self, task, episode):
            return EvalOutput(0.0, False)

    assert isinstance(Flow(), AgentFlow) and isinstance(Scorer(), Evaluator) and not isinstance(Scorer(), AgentFlow)
