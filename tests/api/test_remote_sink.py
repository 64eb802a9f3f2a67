"""The library reports to a running platform (``live_server``) with a real token: ``RemoteSink``
from ``training.platform.reporter`` and the ``training.platform.cli`` commands."""

from __future__ import annotations

import io
import tempfile

import pytest

from training.platform.cli import main as cli
from training.platform.reporter import PlatformClient, RemoteSink
from training.errors import PlatformError
from webapp.dashboard.series import keys_of, points_after
from webapp.runs.models import Run, RunLog

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
def test_a_training_run_started_outside_reports_live(live_server, owner, token_of, registry, published):
    """A real (tiny) AgentTrainer run with the sink: the run appears, fills up, and finishes."""
    from training.trainer import AgentTrainer
    from webapp.policy.checks import load_training_plugins
    from webapp.runs.trainer_args import trainer_kwargs

    load_training_plugins()  # as a training process does: registers the copy dataset
    sink = RemoteSink(live_server.url, token_of(owner), name="from a notebook", tags=["notebook"], flush_seconds=0.2,
                      config={"trainer.total_training_steps": 3})
    with tempfile.TemporaryDirectory() as scratch:
        kwargs = trainer_kwargs(
            agent=registry["agents"]["copy-task"], dataset=registry["datasets"]["copy"], reward=registry["rewards"]["char-accuracy"],
            backend=registry["backends"]["trl"], model="tiny-char", run_path=scratch,
            overrides={"trainer.total_training_steps": 3, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
                       "data.max_response_length": 4},
        )
        with sink:  # creates the run up front; the trainer closes its sinks, which finishes it
            run = Run.objects.get(pk=sink.run_id)
            assert run.status == "running" and run.kind == "external"
            AgentTrainer(**kwargs, sinks=[sink], should_stop=sink.should_stop).train()
    run.refresh_from_db()
    assert run.status == "succeeded" and run.owner == owner and run.tags == ["notebook"] and run.steps == 3
    assert [step for step, _ in points_after(run.pk, -1)["reward"]] == [1, 2, 3]
    assert "reward" in keys_of(run.pk)  # the dashboard's charts read these
    assert RunLog.objects.filter(run=run).exists()  # the training logger's lines
    assert {e["type"] for rid, e in published if rid == run.pk} >= {"run.metrics", "run.logs", "run.status"}


def picky(task, response):
    """Passes the trainer's construction probe (row 0) and raises on row 1, in step 1."""
    if task["prompt"] == "y=":
        raise KeyError("answer")
    return 0.0


@pytest.mark.parametrize("with_block", [True, False], ids=["with", "close"])
def test_a_run_that_fails_outside_reads_failed_with_its_cause(live_server, owner, token_of, tmp_path, with_block):
    """The trainer closes its sinks before its error reaches the caller: the sink is told the run
    failed first, so the platform never reads 'succeeded' for it, however the sink is used."""
    from training.rollouts.outcomes import RewardFailed
    from training.trainer import AgentTrainer

    sink = RemoteSink(live_server.url, token_of(owner), flush_seconds=0.2, capture_logger=None)
    trainer = AgentTrainer(train_dataset=[{"prompt": "x="}, {"prompt": "y="}], reward_func=picky, backend="trl",
                           run_path=str(tmp_path), sinks=[sink],
                           config={"trainer.total_training_steps": 2, "data.train_batch_size": 2,
                                   "actor_rollout_ref.rollout.n": 2, "data.max_response_length": 2,
                                   "actor_rollout_ref.model.path": "tiny-char", "trainer.logger": [], "trainer.cpu_threads": 1})
    with pytest.raises(RewardFailed):
        if with_block:
            with sink:
                trainer.train()
        else:
            sink.start()
            try:
                trainer.train()
            finally:
                sink.close()  # as the module's docstring shows: no status given
    run = Run.objects.get(pk=sink.run_id)
    assert run.status == "failed", run.status
    assert run.error.startswith("RewardFailed: reward function picky raised KeyError: 'answer' on row 1"), run.error


def test_cancel_on_the_platform_stops_the_remote_run(live_server, owner, token_of):
    sink = RemoteSink(live_server.url, token_of(owner), flush_seconds=0.1, heartbeat_seconds=0.1, capture_logger=None)
    sink.log_metrics(1, {"reward": 0.5, "bad": float("nan")})
    Run.objects.get(pk=sink.run_id).request_cancel()
    for _ in range(100):
        if sink.should_stop():
            break
        import time

        time.sleep(0.05)
    assert sink.should_stop()
    sink.close()
    run = Run.objects.get(pk=sink.run_id)
    assert run.status == "cancelled"
    assert {key: pairs for key, pairs in points_after(run.pk, -1).items()} == {"reward": [[1, 0.5]], "bad": [[1, None]]}


def test_a_bad_token_is_a_clear_error(live_server):
    with pytest.raises(PlatformError, match="401"):
        PlatformClient(live_server.url, "wrong").list_runs()
    with pytest.raises(ValueError, match="token"):
        PlatformClient(live_server.url, "")


def test_an_unreachable_platform_does_not_break_training(owner):
    sink = RemoteSink("http://127.0.0.1:9", "token", capture_logger=None)
    sink.log_metrics(1, {"reward": 1.0})  # logged, kept, no exception
    sink.close()


def test_cli_create_list_follow_cancel(live_server, owner, token_of, registry, monkeypatch):
    monkeypatch.setattr(Run, "enqueue", lambda self: None)
    auth = ["--url", live_server.url, "--token", token_of(owner)]
    out = io.StringIO()
    assert cli([*auth, "create", "--agent", "copy-task", "--dataset", "copy", "--reward", "char-accuracy", "--backend", "trl",
                "--model", "tiny-char", "--set", "trainer.total_training_steps=2", "--set", "data.train_batch_size=2",
                "--set", "actor_rollout_ref.rollout.n=2", "--tag", "cli"], out=out) == 0
    run = Run.objects.get()
    assert run.status == "queued" and run.config_overrides["trainer.total_training_steps"] == 2 and run.tags == ["cli"]
    assert f"run {run.pk} queued" in out.getvalue()

    out = io.StringIO()
    assert cli([*auth, "list", "--tag", "cli"], out=out) == 0
    assert str(run.pk) in out.getvalue() and "queued" in out.getvalue()

    out = io.StringIO()
    assert cli([*auth, "cancel", str(run.pk)], out=out) == 0 and "cancelled" in out.getvalue()

    sink = RemoteSink(live_server.url, token_of(owner), capture_logger=None)
    sink.log_metrics(1, {"reward": 0.25})
    sink.log_line("INFO", "first line")
    sink.close()
    out = io.StringIO()
    assert cli([*auth, "follow", str(sink.run_id), "--interval", "0.1"], out=out) == 0
    text = out.getvalue()
    assert "first line" in text and "step 1 reward=0.25" in text and f"run {sink.run_id}: training finished: 1 step, status succeeded" in text


@pytest.mark.real_check
def test_cli_reports_the_platforms_validation_errors(live_server, owner, token_of, registry, capsys):
    code = cli(["--url", live_server.url, "--token", token_of(owner), "create", "--agent", "copy-task", "--dataset", "copy",
                "--backend", "trl", "--model", "tiny-char"])
    assert code == 1 and "reward_func" in capsys.readouterr().err  # the form's own message, by field
