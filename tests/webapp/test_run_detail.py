"""The run page shows status, config, log tail and final metrics, and is ready for live charts."""

from webapp.dashboard.series import SeriesWriter
from webapp.runs.models import RunLog


def test_detail_shows_config_log_and_metrics(owner_client, make_run):
    run = make_run(name="detail", final_config={"data": {"train_batch_size": 2}}, final_metrics={"reward": 0.75})
    RunLog.objects.create(run=run, message="step 1/2 reward=0.5")
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert "queued" in page
    assert "trainer.total_training_steps=2" in page
    assert "step 1/2 reward=0.5" in page
    assert "reward" in page and "0.75" in page
    assert f'data-run-id="{run.pk}"' in page and "data-ws-url" in page


def test_updates_returns_new_points_and_lines(owner_client, make_run):
    run = make_run()
    first = RunLog.objects.create(run=run, message="one")
    RunLog.objects.create(run=run, message="two")
    SeriesWriter(run.pk).write([("reward", 1, 0.5), ("reward", 2, 0.75)])
    data = owner_client.get(f"/runs/{run.pk}/updates.json?after_log={first.pk}").json()
    assert [line["message"] for line in data["logs"]] == ["two"]
    assert data["metrics"] == {"reward": [[1, 0.5], [2, 0.75]]} and data["status"] == "queued"
    later = owner_client.get(f"/runs/{run.pk}/updates.json?after_step=1").json()
    assert later["metrics"] == {"reward": [[2, 0.75]]}
