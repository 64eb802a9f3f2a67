"""Our columns in verl's rollout dumps (``training.backends.verl.dumps``), on verl's own trainer code.

verl's trainers cannot be built here (CUDA GPUs, Ray workers): each test takes verl's trainer class
as our TaskRunner makes it (``dumping_trainer``) and calls its dump method on a batch laid out as
verl lays it out (or its validation method, on batches a stand-in of verl's rollout manager
generates), the object made without its constructor (which starts workers). The legacy
trainer's batch is a real ``DataProto`` built from tensors; the default trainer reads its batch
from verl's TransferQueue, which runs on Ray: ``standins.verl_trainer._TransferQueue`` stands in
for it, and two slow tests start the real one on a Ray cluster of their own (a training dump;
a validation, with verl's own replay buffer).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from standins.verl_trainer import _TransferQueue
from training.backends.verl.backend import EPISODE_RECORD_KEY, rollout_rows_to_records
from training.rollouts.tiny import build_char_tokenizer

dumps = pytest.importorskip("training.backends.verl.dumps")
from transfer_queue import KVBatchMeta  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.trainer import main_ppo_v0  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402
from verl.trainer.ppo.v1 import trainer_base  # noqa: E402
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402

TOKENIZER = build_char_tokenizer()
PAD, EOS = TOKENIZER.pad_token_id, TOKENIZER.eos_token_id


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def trainer(cls: type, step: int):
    made = object.__new__(dumps.dumping_trainer(cls))
    made.tokenizer, made.global_steps = TOKENIZER, step
    made._init_dump_executor()
    return made


def dumped(folder, step: int) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{step}.jsonl").read_text().splitlines()]


def legacy_batch() -> DataProto:
    """Two samples as verl's legacy agent loop hands them to its trainer: prompts padded on the
    left to the batch's prompt width, responses on the right (mask 0 on a tool's tokens)."""
    prompts = [ids("go>"), ids("x>")]
    responses = [ids("ab") + [EOS], ids("a")]
    masks = [[1, 1, 1], [1]]
    width, length = 4, 5
    batch = {name: torch.full((2, size), PAD, dtype=torch.long)
             for name, size in (("prompts", width), ("responses", length), ("response_mask", length))}
    batch["attention_mask"] = torch.zeros(2, width + length, dtype=torch.long)
    batch["rollout_log_probs"] = torch.zeros(2, length)
    batch["token_level_scores"] = torch.zeros(2, length)
    for i, (prompt, response, mask) in enumerate(zip(prompts, responses, masks)):
        batch["prompts"][i, width - len(prompt):] = torch.tensor(prompt)
        batch["responses"][i, :len(response)] = torch.tensor(response)
        batch["response_mask"][i, :len(mask)] = torch.tensor(mask)
        batch["attention_mask"][i, width - len(prompt):width + len(response)] = 1
        batch["rollout_log_probs"][i, :len(response)] = -0.5
        batch["token_level_scores"][i, len(response) - 1] = float(i == 0)
    return DataProto.from_dict(tensors=batch, non_tensors={
        "data_source": np.array(["math", "math"], dtype=object),
        "extra_info": np.array([{"index": 7}, {"index": 8}], dtype=object),
        "reward_model": np.array([{"ground_truth": "ab"}, {"ground_truth": "ab"}], dtype=object),
    })


def test_the_legacy_trainers_dump_gets_the_tokens_of_its_dataproto(tmp_path):
    made = trainer(RayPPOTrainer, 5)
    made._log_rollout_data(legacy_batch(), {"acc": [1.0, 0.0]}, {}, str(tmp_path))
    made._shutdown_dump_executor()
    rows = dumped(tmp_path, 5)
    assert [(r["input"], r["output"], r["gts"], r["score"], r["step"], r["acc"]) for r in rows] == [
        ("go>", "ab", "ab", 1.0, 5, 1.0), ("x>", "a", "ab", 0.0, 5, 0.0)]  # verl's keys as verl writes them
    assert [r["prompt_ids"] for r in rows] == [ids("go>"), ids("x>")]  # no padding
    assert [r["response_ids"] for r in rows] == [ids("ab") + [EOS], ids("a")]
    assert [r["response_mask"] for r in rows] == [[1, 1, 1], [1]]
    assert [r["rollout_log_probs"] for r in rows] == [[-0.5] * 3, [-0.5]]
    assert [(r["data_source"], r["row_index"]) for r in rows] == [("math", 7), ("math", 8)]
    assert rows[0]["token_texts"] == ["a", "b", TOKENIZER.decode([EOS])] and "generation_seconds" not in rows[0]
    records = rollout_rows_to_records(rows, 5, "train")
    assert [r["token_ids"] for r in records] == [ids("ab") + [EOS], ids("a")]
    assert [(r["mask"], r["logprobs"], r["response_length"]) for r in records] == [([1, 1, 1], [-0.5] * 3, 3), ([1], [-0.5], 1)]
    assert [(r["data_source"], r["row_index"], r["reward_components"]) for r in records] == [
        ("math", 7, {"score": 1.0, "acc": 1.0}), ("math", 8, {"score": 0.0, "acc": 0.0})]


def test_rows_with_our_agent_loops_record_get_no_token_texts_of_their_own(tmp_path):
    made = trainer(RayPPOTrainer, 1)
    made._log_rollout_data(legacy_batch(), {EPISODE_RECORD_KEY: ["{}", "{}"]}, {}, str(tmp_path))
    made._shutdown_dump_executor()
    rows = dumped(tmp_path, 1)
    assert [(row["response_ids"], "token_texts" in row) for row in rows] == [(ids("ab") + [EOS], False), (ids("a"), False)]


class ChunkWorker:
    """One of verl's agent loop workers as its rollout manager calls it
    (``worker.generate_sequences.remote(chunk)``, awaited): the chunk answered as ``legacy_batch``'s
    two samples, each with its own ``AgentLoopMetrics`` as verl's worker returns them."""

    def __init__(self, seconds: tuple[float, float]) -> None:
        self.seconds = seconds
        self.generate_sequences = self

    def remote(self, chunk: DataProto):
        async def generated() -> DataProto:
            output = legacy_batch()
            output.meta_info["metrics"] = [AgentLoopMetrics(generate_sequences=s, num_preempted=0).model_dump()
                                           for s in self.seconds]
            return output
        return generated()


def test_the_legacy_trainers_dump_keeps_each_samples_generation_time(tmp_path, monkeypatch):
    """verl's rollout manager itself (``AgentLoopManager.generate_sequences``, made without its
    constructor, which starts Ray actors) over two stand-in workers: verl folds the samples' times
    into the step's timing; our trainer class's ``init_workers`` makes the manager keep them, in the
    order of the samples, for the dump."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    manager = object.__new__(AgentLoopManager)
    manager.agent_loop_workers = [ChunkWorker((0.5, 0.25)), ChunkWorker((1.5, 2.0))]
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: setattr(self, "async_rollout_manager", manager))
    made = trainer(RayPPOTrainer, 2)
    made.init_workers()
    generated = made.async_rollout_manager.generate_sequences(DataProto.concat([legacy_batch(), legacy_batch()]))
    assert generated.meta_info["timing"]["agent_loop/generate_sequences/max"] == 2.0  # verl's own timing as before
    made._log_rollout_data(generated, {"acc": [1.0, 0.0, 1.0, 0.0]}, {}, str(tmp_path))
    made._shutdown_dump_executor()
    rows = dumped(tmp_path, 2)
    assert [row["generation_seconds"] for row in rows] == [0.5, 0.25, 1.5, 2.0]
    records = rollout_rows_to_records(rows, 2, "train")
    assert [(r["generation_seconds"], r["turns"][0]["generation_seconds"]) for r in records] == [
        (0.5, 0.5), (0.25, 0.25), (1.5, 1.5), (2.0, 2.0)]


def test_a_rollout_manager_of_another_kind_is_dumped_without_times(tmp_path, monkeypatch):
    """A manager without verl's ``_performance_metrics`` (a custom ``agent_loop_manager_class``):
    left as it is, its rows carry no time rather than a wrong one."""
    rollouts = LegacyValidationRollouts()
    monkeypatch.setattr(RayPPOTrainer, "init_workers", lambda self: setattr(self, "async_rollout_manager", rollouts))
    made = trainer(RayPPOTrainer, 3)
    made.init_workers()
    assert made.async_rollout_manager is rollouts and "_performance_metrics" not in vars(rollouts)
    made._log_rollout_data(legacy_batch(), {"acc": [1.0, 0.0]}, {}, str(tmp_path))
    made._shutdown_dump_executor()
    assert ["generation_seconds" in row for row in dumped(tmp_path, 3)] == [False, False]


class LegacyValidationRollouts:
    """verl's legacy rollout manager in validation, on CPU: each sample of the (padded) batch it is
    handed answered "a", "aa", "aaa"... in the order it generates them (verl's padding rows among
    them), then EOS, as a ``DataProto`` laid out as verl's agent loop lays it out (prompts padded on
    the left, responses on the right), with its rollout's log-probabilities and its reward
    function's score and ``acc`` (1 for an odd reply's length)."""

    def __init__(self) -> None:
        self.generated = 0

    def generate_sequences(self, batch: DataProto) -> DataProto:
        prompts = [ids(raw[0]["content"]) for raw in batch.non_tensor_batch["raw_prompt"]]
        responses = []
        for _ in prompts:
            self.generated += 1
            responses.append(ids("a" * self.generated) + [EOS])
        width, length = max(map(len, prompts)), max(map(len, responses))
        tensors = {name: torch.full((len(prompts), size), PAD, dtype=torch.long)
                   for name, size in (("prompts", width), ("responses", length), ("response_mask", length))}
        tensors["attention_mask"] = torch.zeros(len(prompts), width + length, dtype=torch.long)
        tensors["rollout_log_probs"] = torch.zeros(len(prompts), length)
        tensors["rm_scores"] = torch.zeros(len(prompts), length)
        acc = []
        for i, (prompt, response) in enumerate(zip(prompts, responses)):
            tensors["prompts"][i, width - len(prompt):] = torch.tensor(prompt)
            tensors["responses"][i, :len(response)] = torch.tensor(response)
            tensors["response_mask"][i, :len(response)] = 1
            tensors["attention_mask"][i, width - len(prompt):width + len(response)] = 1
            tensors["rollout_log_probs"][i, :len(response)] = -0.5
            acc.append(float(len(response) % 2 == 0))
            tensors["rm_scores"][i, len(response) - 1] = acc[-1]
        return DataProto.from_dict(tensors=tensors, non_tensors={"acc": np.array(acc, dtype=object)},
                                   meta_info={"reward_extra_keys": ["acc"]})


def test_the_legacy_trainers_validation_dump_gets_the_tokens_of_each_generated_batch(tmp_path):
    """verl's legacy ``_validate`` itself: two batches (rows 0-1 and 2), each repeated
    ``val_kwargs.n`` = 2 times and padded to a multiple of the agent loop's 3 workers before it is
    generated; verl keeps their text only and dumps them together at the end."""
    from verl.utils.dataset.rl_dataset import collate_fn

    made = trainer(RayPPOTrainer, 4)
    made.config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"val_kwargs": {"n": 2, "do_sample": False}, "agent": {"num_workers": 3}}},
        "trainer": {"validation_data_dir": str(tmp_path), "log_val_generations": 0}})
    made.use_rm, made.async_rollout_manager = False, LegacyValidationRollouts()
    dataset = [{"raw_prompt": [{"role": "user", "content": f"go{i}>"}], "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                "data_source": "math", "reward_model": {"ground_truth": "a"}, "extra_info": {"index": i}} for i in range(3)]
    made.val_dataloader = [collate_fn(dataset[:2]), collate_fn(dataset[2:])]
    made._validate()
    made._shutdown_dump_executor()
    rows = dumped(tmp_path, 4)
    # verl's own keys as verl writes them: the first batch's 4 samples (2 padding rows generated
    # after them), then the second's 2 (1 padding row after them).
    assert [(r["input"], r["output"], r["score"], r["acc"], r["step"]) for r in rows] == [
        ("go0>", "a", 1.0, 1.0, 4), ("go0>", "aa", 0.0, 0.0, 4), ("go1>", "aaa", 1.0, 1.0, 4), ("go1>", "aaaa", 0.0, 0.0, 4),
        ("go2>", "a" * 7, 1.0, 1.0, 4), ("go2>", "a" * 8, 0.0, 0.0, 4)]
    assert [r["prompt_ids"] for r in rows] == [ids(f"go{i}>") for i in (0, 0, 1, 1, 2, 2)]  # no padding
    assert [r["response_ids"] for r in rows] == [ids(r["output"]) + [EOS] for r in rows]
    assert [r["response_mask"] for r in rows] == [[1] * len(r["response_ids"]) for r in rows]
    assert [r["rollout_log_probs"] for r in rows] == [[-0.5] * len(r["response_ids"]) for r in rows]
    assert [(r["data_source"], r["row_index"]) for r in rows] == [("math", i) for i in (0, 0, 1, 1, 2, 2)]
    assert all(len(r["token_texts"]) == len(r["response_ids"]) for r in rows)
    records = rollout_rows_to_records(rows, 4, "val")
    assert [(r["token_ids"], r["mask"], r["row_index"]) for r in records] == [
        (r["response_ids"], r["response_mask"], r["row_index"]) for r in rows]
    assert made.async_rollout_manager.__class__ is LegacyValidationRollouts  # verl's own manager again


def transfer_queue_samples() -> dict[str, dict]:
    """Two samples of one prompt as verl's ``AgentLoopWorkerTQ`` puts them in its TransferQueue."""
    samples = {}
    for session, (reply, seconds, reward) in enumerate([("ab", 0.5, 1.0), ("a", 0.25, 0.0)]):
        response = ids(reply) + [EOS]
        output = AgentLoopOutput(
            prompt_ids=ids("go>"), response_ids=response, response_mask=[1] * len(response),
            response_logprobs=[-0.5] * len(response), reward_score=reward, num_turns=2,
            metrics=AgentLoopMetrics(generate_sequences=seconds), extra_fields={"reward_extra_info": {"acc": reward}})
        field = output.as_dict()
        field.update(uid="u1", session_id=session, data_source="math", extra_info={"index": 3},
                     reward_model={"ground_truth": "ab"})
        samples[f"u1_{session}_0"] = field
    return samples


def default_trainers_dump(folder) -> list[dict]:
    """Step 2's dump by verl's default trainer made ``dumping_trainer``, of the samples put in the
    TransferQueue (``transfer_queue_samples``), handed out in another order than verl dumps them."""
    made = trainer(trainer_base.get_trainer_cls("sync"), 2)
    made._log_rollout_data(KVBatchMeta(keys=["u1_1_0", "u1_0_0"], tags=[{}, {}], partition_id="train"), {}, str(folder))
    made._shutdown_dump_executor()
    return dumped(folder, 2)


def check_default_trainers_dump(rows: list[dict]) -> None:
    assert [(r["uid"], r["output"], r["score"], r["acc"]) for r in rows] == [("u1_0_0", "ab", 1.0, 1.0), ("u1_1_0", "a", 0.0, 0.0)]
    assert [r["response_ids"] for r in rows] == [ids("ab") + [EOS], ids("a") + [EOS]]
    assert [(r["generation_seconds"], r["row_index"], r["data_source"]) for r in rows] == [(0.5, 3, "math"), (0.25, 3, "math")]
    assert rows[0]["rollout_log_probs"] == [-0.5] * 3 and rows[0]["prompt_ids"] == ids("go>")


def test_the_default_trainers_dump_gets_each_samples_tokens_times_and_reward_values_by_key(tmp_path):
    with _TransferQueue(transfer_queue_samples()):
        check_default_trainers_dump(default_trainers_dump(tmp_path))


@pytest.mark.slow
def test_the_default_trainers_dumps_through_verls_own_transfer_queue(tmp_path):
    """The training and the validation dump through verl's TransferQueue itself, as verl's
    TaskRunner starts it (``tq.init``), on one Ray cluster of this machine's own (starting one costs
    tens of CPU seconds, so both dumps share it)."""
    import ray
    import transfer_queue as tq

    ray.init(address="local", num_cpus=4, include_dashboard=False)  # TransferQueue's controller and two storage units take a CPU each
    try:
        tq.init()
        try:
            check_training_dump_through_transfer_queue(tmp_path / "train")
            check_validation_dump_through_transfer_queue(tmp_path / "val")
        finally:
            tq.close()
    finally:
        ray.shutdown()


def check_training_dump_through_transfer_queue(folder: Path) -> None:
    """The samples put as ``AgentLoopWorkerTQ`` puts them; the default trainer's dump gets our columns."""
    import transfer_queue as tq
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    folder.mkdir()
    for key, field in transfer_queue_samples().items():
        tq.kv_batch_put(keys=[key], fields=list_of_dict_to_tensordict([field]), tags=[{"status": "success"}],
                        partition_id="train")
    check_default_trainers_dump(default_trainers_dump(folder))


def check_validation_dump_through_transfer_queue(folder: Path) -> None:
    """verl's default ``_validate`` itself, on verl's TransferQueue and verl's own replay buffer: two
    validation batches (rows 0-1 and 2), each prompt's two samples put as ``AgentLoopWorkerTQ`` puts
    them (then the prompt marked finished), sampled, read and cleared by verl before the next
    batch; the dump at the end gets our columns."""
    import transfer_queue as tq
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    folder.mkdir()

    class Rollouts:  # verl's AgentLoopManagerTQ in validation: GPUs and vLLM are not here
        def generate_sequences(self, batch) -> None:
            for i in range(len(batch)):
                prompt = {name: batch[name][i] for name in ("uid", "data_source", "extra_info", "reward_model")}
                row = prompt["extra_info"]["index"]
                keys, fields = [], []
                for session, reply in enumerate(("ab", "a")):
                    response = ids(reply) + [EOS]
                    field = AgentLoopOutput(
                        prompt_ids=ids(f"go{row}>"), response_ids=response, response_mask=[1] * len(response),
                        response_logprobs=[-0.5] * len(response), reward_score=float(session == 0), num_turns=2,
                        metrics=AgentLoopMetrics(generate_sequences=0.5),
                        extra_fields={"reward_extra_info": {"acc": float(session == 0)}}).as_dict()
                    field.update(prompt, session_id=session, global_steps=3)
                    keys.append(f"{prompt['uid']}_{session}_0")
                    fields.append(field)
                tq.kv_batch_put(keys=keys, fields=list_of_dict_to_tensordict(fields), partition_id="val",
                                tags=[{"status": "success", "global_steps": 3} for _ in keys])
                tq.kv_put(key=prompt["uid"], partition_id="val", tag={"status": "finished"})

    made = trainer(trainer_base.get_trainer_cls("sync"), 3)
    made.config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"val_kwargs": {"n": 2}}},
        "trainer": {"validation_data_dir": str(folder), "log_val_generations": 0}})
    dataset = [{"raw_prompt": [{"role": "user", "content": f"go{i}>"}], "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                "data_source": "math", "reward_model": {"ground_truth": "ab"}, "extra_info": {"index": i}} for i in range(3)]
    made.val_dataloader = [collate_fn(dataset[:2]), collate_fn(dataset[2:])]
    made.agent_loop_manager = Rollouts()
    made.reward_loop_manager = type("RewardLoops", (), {"reward_loop_worker_handles": []})()  # rewards come with the samples
    made.replay_buffer = ReplayBuffer(
        trainer_mode="sync", trainer_config=OmegaConf.create({}), max_off_policy_threshold=None,
        max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create({}), poll_interval=0.1)
    made._validate()
    made._shutdown_dump_executor()
    assert not (tq.kv_list() or {}).get("val")  # verl cleared every batch it read
    rows = dumped(folder, 3)
    assert sorted((r["row_index"], r["output"], r["score"], r["acc"]) for r in rows) == [
        (i, reply, score, score) for i in range(3) for reply, score in (("a", 0.0), ("ab", 1.0))]
    for row in rows:  # verl's text of each sample and our tokens of it are the same sample's
        assert row["input"] == f"go{row['row_index']}>" and row["prompt_ids"] == ids(row["input"])
        assert row["response_ids"] == ids(row["output"]) + [EOS] and row["response_mask"] == [1] * len(row["response_ids"])
        assert row["rollout_log_probs"] == [-0.5] * len(row["response_ids"]) and row["generation_seconds"] == 0.5
        assert row["data_source"] == "math" and row["reward"] == row["score"]


def test_a_batch_our_columns_cannot_be_made_of_is_dumped_as_verl_dumps_it(tmp_path):
    samples = transfer_queue_samples()
    for sample in samples.values():
        del sample["response_mask"]  # laid out otherwise than verl 0.9.1 lays it out (verl's own dump reads none)
    with _TransferQueue(samples):
        rows = default_trainers_dump(tmp_path)
    assert [sorted(row) for row in rows] == [["gts", "input", "output", "score", "step", "uid"]] * 2


def test_our_task_runners_train_with_verls_trainer_made_to_dump_tokens(monkeypatch):
    """Ray is not started: each runner is the plain class verl's actor would hold, verl's ``run``
    replaced by one that reports the trainer class it would build."""
    monkeypatch.setitem(trainer_base.TRAINER_REGISTRY, "sync", trainer_base.get_trainer_cls("sync"))
    monkeypatch.setattr(main_ppo_v0, "RayPPOTrainer", RayPPOTrainer)
    built = []
    runner = dumps._TaskRunner()
    monkeypatch.setattr(runner.runner, "run", lambda config: built.append(
        trainer_base.get_trainer_cls(config.trainer.v1.trainer_mode)))
    runner.run(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "sync"}}}))
    legacy = dumps._LegacyTaskRunner()
    monkeypatch.setattr(legacy.runner, "run", lambda config: built.append(main_ppo_v0.RayPPOTrainer))
    legacy.run(OmegaConf.create({}))
    (default, old) = built
    assert issubclass(default, dumps.DumpsTokens) and issubclass(default, PPOTrainerSync)
    assert issubclass(old, dumps.LegacyDumpsTokens) and issubclass(old, RayPPOTrainer)
    assert dumps.task_runner(True) is dumps.TASK_RUNNER and dumps.task_runner(False) is dumps.LEGACY_TASK_RUNNER
