"""The compare page: a table of only the config keys the selected runs differ on, and the data of
the scatter of a final metric against one of them."""

from __future__ import annotations


def test_only_differing_keys_are_listed_with_each_runs_value(owner_client, make_run):
    from training.config import Config

    common = {"data.train_batch_size": 2, "trainer.total_training_steps": 2}
    runs = []
    for lr, reward in ((0.01, 0.3), (0.001, 0.6)):
        config = Config.build({**common, "actor_rollout_ref.actor.optim.lr": lr}).to_dict()
        runs.append(make_run(name=f"lr {lr}", final_config=config, final_metrics={"reward": reward}, status="succeeded"))
    response = owner_client.get("/dashboard/compare/", {"runs": ",".join(str(r.pk) for r in runs)})
    assert response.status_code == 200
    rows = {row["key"]: row["values"] for row in response.context["param_rows"]}
    assert rows == {"actor_rollout_ref.actor.optim.lr": [0.01, 0.001]}  # batch size, steps, ... are equal
    points = response.context["param_points"]
    assert [r["metrics"]["reward"] for r in points["runs"]] == [0.3, 0.6]
    page = response.content.decode()
    assert 'id="compare-params"' in page and '<tr data-key="actor_rollout_ref.actor.optim.lr">' in page


def test_the_registry_choices_and_the_model_are_compared_by_name_first(owner_client, make_run, registry):
    """Runs that differ in agent, dataset, reward and model (the form's choices, not dotted keys):
    each is a row of its own, with the names a person picked, before the config keys."""
    copy = make_run(name="copy", config_overrides={"data.train_batch_size": 2})
    lake = make_run(name="lake", agent=registry["agents"]["frozenlake"], dataset=registry["datasets"]["frozenlake"],
                    reward=None, model="Qwen/Qwen2.5-0.5B-Instruct", config_overrides={"data.train_batch_size": 4})
    response = owner_client.get("/dashboard/compare/", {"runs": f"{copy.pk},{lake.pk}"})
    rows = [(row["key"], row["values"]) for row in response.context["param_rows"]]
    assert rows == [("agent", ["copy-task", "frozenlake"]), ("dataset", ["copy", "frozenlake"]),
                    ("reward", ["char-accuracy", None]), ("model", ["tiny-char", "Qwen/Qwen2.5-0.5B-Instruct"]),
                    ("data.train_batch_size", [2, 4])]
    page = response.content.decode()
    for key in ("agent", "dataset", "reward", "model"):
        assert f'<tr data-key="{key}">' in page
    assert "<td>char-accuracy</td><td>—</td>" in page
