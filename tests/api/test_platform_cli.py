"""``agent-trainer-platform`` against a running platform (``live_server``): ``login`` stores a token the
other commands then use, ``follow`` prints one line per step, errors read as sentences."""

from __future__ import annotations

import io
import os
import stat

import pytest

from training.platform.cli import main as cli
from training.platform.reporter import RemoteSink
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def credentials(tmp_path, monkeypatch):
    path = tmp_path / "config" / "platform.json"
    monkeypatch.setenv("AGENT_TRAINER_CREDENTIALS", str(path))
    for name in ("PLATFORM_URL", "PLATFORM_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_login_stores_a_token_the_other_commands_use(live_server, owner, credentials, monkeypatch, make_run):
    make_run(name="mine")
    monkeypatch.setattr("sys.stdin", io.StringIO("owner-password\n"))
    out = io.StringIO()
    assert cli(["--url", live_server.url, "login", "--username", "owner", "--password-stdin"], out=out) == 0
    assert "Logged in" in out.getvalue() and credentials.exists()
    assert stat.S_IMODE(os.stat(credentials).st_mode) == 0o600  # the token is readable by its owner only

    out = io.StringIO()
    assert cli(["list"], out=out) == 0  # no --url, no --token: the stored ones
    assert "mine" in out.getvalue()


def test_a_wrong_password_and_an_unreachable_platform_are_sentences(live_server, owner, credentials, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("wrong\n"))
    assert cli(["--url", live_server.url, "login", "--username", "owner", "--password-stdin"]) == 1
    err = capsys.readouterr().err
    assert "refused that username and password" in err and "{" not in err and not credentials.exists()

    assert cli(["--url", "http://127.0.0.1:9", "--token", "x", "list"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:9" in err and "Is the platform running" in err and "Errno" not in err


@pytest.mark.real_check
def test_validation_errors_print_as_field_sentences(live_server, owner, token_of, registry, capsys):
    code = cli(["--url", live_server.url, "--token", token_of(owner), "create", "--agent", "copy-task", "--dataset", "copy",
                "--backend", "trl", "--model", "tiny-char"])
    err = capsys.readouterr().err
    assert code == 1 and "reward_func" in err
    assert "{'" not in err and "['" not in err  # no Python reprs of the API's JSON


def test_follow_prints_one_line_per_step(live_server, owner, token_of):
    sink = RemoteSink(live_server.url, token_of(owner), capture_logger=None)
    for step in (1, 2, 3):
        sink.log_metrics(step, {"reward": step / 4, "loss": 0.5, "timing/generate": 0.1, "kl": 0.01})
        sink.log_line("INFO", f"step {step} reward={step / 4}")  # the trainer's own summary line
    sink.log_line("WARNING", "a warning worth reading")
    sink.close()
    out = io.StringIO()
    assert cli(["--url", live_server.url, "--token", token_of(owner), "follow", str(sink.run_id), "--interval", "0.1"], out=out) == 0
    lines = out.getvalue().splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert steps == ["step 1 reward=0.25 loss=0.5 kl=0.01", "step 2 reward=0.5 loss=0.5 kl=0.01",
                     "step 3 reward=0.75 loss=0.5 kl=0.01"]
    assert any("a warning worth reading" in line for line in lines)
    assert lines[-1] == f"run {sink.run_id}: training finished: 3 steps, status succeeded"
    assert lines[-2].startswith("step 3 ") and Run.objects.get(pk=sink.run_id).status == "succeeded"


def test_follow_says_a_failed_run_failed_not_finished(live_server, owner, token_of):
    sink = RemoteSink(live_server.url, token_of(owner), capture_logger=None)
    sink.log_metrics(1, {"reward": 0.5})
    sink.close(status="failed", error="ValueError: the reward raised")
    out = io.StringIO()
    assert cli(["--url", live_server.url, "--token", token_of(owner), "follow", str(sink.run_id), "--interval", "0.1"], out=out) == 1
    assert out.getvalue().splitlines()[-1] == f"run {sink.run_id}: training failed: 1 step, status failed: ValueError: the reward raised"


def test_a_wrong_agent_or_dataset_name_is_answered_with_the_names_to_choose(live_server, owner, token_of, registry, capsys):
    code = cli(["--url", live_server.url, "--token", token_of(owner), "create", "--agent", "copy-tsk", "--dataset", "copi",
                "--reward", "char-accuracy", "--backend", "trl", "--model", "tiny-char"])
    err = capsys.readouterr().err
    assert code == 1
    assert "No agent named 'copy-tsk' among those you may use; choose one of: calculator, copy-task, countdown, frozenlake." in err
    assert "No dataset named 'copi' among those you may use; choose one of: arithmetic, copy, countdown, frozenlake." in err
    assert not Run.objects.exists()
