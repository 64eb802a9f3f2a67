"""The playground: a person asks a run's saved model in the browser; the web process only records
the question, a worker's child process loads the weights with transformers and answers.

The answering here is the real one (``answer_request`` starts the real child process on the test
database, forked by a warm process as a worker's is; the model is the tiny built-in one, saved as
the run's final model); only the Celery hop is skipped, which tests/browser/test_newcomer.py drives
through a real worker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from training.data import load_dataset
from training.rollouts.tiny import save_tiny_model
from webapp.playground.models import PlaygroundRequest
from webapp.registry.models import Model
from webapp.runs.models import Run
from webapp.policy.checks import load_training_plugins
from webapp.teams.models import Membership
from workers.processes import WARM_PROCESS_ADDRESS, database_url
from workers.playground import answer_request, dispatch_due_requests, trusts_remote_code

# Tests whose child process reads the rows need them committed (transaction=True); the rest do not.
committed = pytest.mark.django_db(transaction=True)
pytestmark = pytest.mark.usefixtures("warm_process")


@pytest.fixture
def trained_run(make_run):
    """A succeeded run whose folder (under the real RUNS_DIR, which the child process reads) holds a final model."""
    run = make_run(status=Run.Status.SUCCEEDED, steps=2)
    folder = run.folder()
    save_tiny_model(folder / "final_model", seed=3)
    Run.objects.filter(pk=run.pk).update(run_path=str(folder))
    run.refresh_from_db()
    yield run
    shutil.rmtree(folder, ignore_errors=True)


def ask(client, run, **body):
    body = {"kind": "chat", "model": "final_model", "messages": [{"role": "user", "content": "abc"}],
            "max_new_tokens": 8, "temperature": 0, **body}
    return client.post(f"/runs/{run.pk}/playground/ask", json.dumps(body), content_type="application/json")


def greedy_reply(folder, prompt: str, max_new_tokens: int) -> str:
    """What the saved weights answer, computed here with transformers directly."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@committed
def test_a_question_is_answered_by_the_worker_with_the_runs_weights(trained_run, owner_client):
    page = owner_client.get(f"/runs/{trained_run.pk}/playground/")
    assert page.status_code == 200 and b"Final model" in page.content
    response = ask(owner_client, trained_run, messages=[{"role": "user", "content": "hello there"}], max_new_tokens=6)
    assert response.status_code == 201, response.content
    asked = PlaygroundRequest.objects.get(pk=response.json()["id"])
    assert asked.status == "queued" and asked.queue == trained_run.backend.queue and response.json()["ahead"] == 0

    assert answer_request(asked.pk, "test-worker@here") == "succeeded"
    state = owner_client.get(response.json()["url"]).json()
    assert state["status"] == "succeeded", state["error"]
    assert state["worker"] == "test-worker@here" and state["device"] == "cpu" and state["prompt_tokens"] == len("hello there")
    assert 1 <= state["reply_tokens"] <= 6
    assert state["reply"] == greedy_reply(trained_run.folder() / "final_model", "hello there", 6)


@committed
def test_the_web_process_never_imports_torch_to_ask_or_poll(trained_run, owner):
    """The page, the question and the poll in a fresh Django process: torch stays unimported."""
    script = f"""
import os, sys, json
os.environ["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
import django; django.setup()
from django.test import Client
from django.contrib.auth import get_user_model
client = Client(); client.force_login(get_user_model().objects.get(pk={owner.pk}))
assert client.get("/runs/{trained_run.pk}/playground/").status_code == 200
body = {{"kind": "chat", "model": "final_model", "messages": [{{"role": "user", "content": "hi"}}], "max_new_tokens": 4}}
answer = client.post("/runs/{trained_run.pk}/playground/ask", json.dumps(body), content_type="application/json")
assert answer.status_code == 201, answer.content
assert client.get(answer.json()["url"]).json()["status"] == "queued"
print(json.dumps(sorted(m for m in ("torch", "transformers") if m in sys.modules)))
"""
    env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict), "ALLOWED_HOSTS": "testserver"}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@committed
def test_the_agent_plays_one_dataset_row(make_run, registry, owner_client):
    run = make_run(status=Run.Status.SUCCEEDED, steps=2, agent=registry["agents"]["frozenlake"],
                   dataset=registry["datasets"]["frozenlake"], reward=None,
                   config_overrides={"rllm.agent.max_steps": 3, "rllm.agent.max_tokens_per_turn": 1})
    folder = run.folder()
    try:
        save_tiny_model(folder / "final_model")
        Run.objects.filter(pk=run.pk).update(run_path=str(folder))
        response = ask(owner_client, run, kind="row", split="test", row=1, messages=None)
        assert response.status_code == 201, response.content
        assert answer_request(response.json()["id"], "w") == "succeeded", PlaygroundRequest.objects.get().error
        episode = owner_client.get(response.json()["url"]).json()["episode"]
        load_training_plugins()  # the examples' registered datasets
        assert episode["task"] == load_dataset("frozenlake:test")[1]
        # At most max_steps model turns (the agent also records the last observation as a step).
        assert 1 <= sum(bool(turn["response"]) for turn in episode["turns"]) <= 3 and len(episode["turns"]) == episode["num_turns"]
        assert episode["termination_reason"] in ("env_done", "max_turns") and isinstance(episode["reward"], float)
        assert all(len(turn["response"]) <= 1 for turn in episode["turns"])  # max_tokens_per_turn=1, as in training
        assert all(turn["prompt"] for turn in episode["turns"])  # what the environment showed the agent each turn

        too_far = ask(owner_client, run, kind="row", split="test", row=100_000, messages=None)
        answer_request(too_far.json()["id"], "w")
        failed = owner_client.get(too_far.json()["url"]).json()
        assert failed["status"] == "failed" and "Row 100000" in failed["error"] and "rows (0 to" in failed["error"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.django_db
def test_who_may_ask_is_who_may_view_the_run(trained_run, page_client, stranger, teammate, project, owner):
    stranger_client = page_client(stranger)
    assert stranger_client.get(f"/runs/{trained_run.pk}/playground/").status_code == 404
    assert ask(stranger_client, trained_run).status_code == 404
    assert page_client(None).get(f"/runs/{trained_run.pk}/playground/").status_code == 302  # to the login page

    mine = ask(page_client(owner), trained_run).json()
    Run.objects.filter(pk=trained_run.pk).update(project=project, visibility=Run.Visibility.TEAM)
    teammate_client = page_client(teammate)
    assert ask(teammate_client, trained_run).status_code == 201
    assert teammate_client.get(mine["url"]).status_code == 404  # someone else's conversation stays theirs
    Membership.objects.filter(user=teammate).delete()
    assert ask(teammate_client, trained_run).status_code == 404


BAD_QUESTIONS = [
    ({"max_new_tokens": 100_000}, "max_new_tokens", "less than or equal to"),
    ({"max_new_tokens": 0}, "max_new_tokens", "greater than or equal to"),
    ({"temperature": 50}, "temperature", "less than or equal to"),
    ({"model": "../../etc"}, "model", "Select a valid choice"),
    ({"model": "checkpoint-99"}, "model", "Select a valid choice"),
    ({"messages": [{"role": "user", "content": "x"}] * 41}, "messages", "At most 40 messages"),
    ({"messages": [{"role": "user", "content": "x" * 20_000}]}, "messages", "at most 16000"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages", "must end with yours"),
    ({"messages": [{"role": "tool", "content": "hi"}]}, "messages", "Message 1"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}, "messages", "only the first"),
    ({"kind": "row", "messages": None}, "row", "index of the dataset row")]


@pytest.mark.django_db
def test_every_number_and_text_is_bounded(trained_run, owner_client):
    for body, field, words in BAD_QUESTIONS:
        response = ask(owner_client, trained_run, **body)
        assert response.status_code == 400, body
        assert words in " ".join(response.json()["errors"][field]), response.json()
    assert not PlaygroundRequest.objects.exists()


@pytest.mark.django_db
def test_one_person_waits_for_a_few_answers_at_most(trained_run, owner_client, settings):
    settings.PLAYGROUND_MAX_PENDING = 2
    assert [ask(owner_client, trained_run).status_code for _ in range(3)] == [201, 201, 429]
    assert "wait for 2 answer" in ask(owner_client, trained_run).json()["error"]


@pytest.mark.django_db
def test_a_question_nobody_takes_in_time_says_so(trained_run, owner_client, settings):
    response = ask(owner_client, trained_run)
    asked = PlaygroundRequest.objects.get(pk=response.json()["id"])
    PlaygroundRequest.objects.filter(pk=asked.pk).update(
        created_at=timezone.now() - timedelta(seconds=settings.PLAYGROUND_QUEUE_SECONDS + 1))
    state = owner_client.get(response.json()["url"]).json()
    assert state["status"] == "expired"
    assert f"No worker of the '{trained_run.backend.queue}' queue was free within {settings.PLAYGROUND_QUEUE_SECONDS} s" in state["error"]
    assert answer_request(asked.pk, "late-worker") == ""  # a worker that frees up later does not take it any more
    assert PlaygroundRequest.objects.get(pk=asked.pk).worker == ""


@pytest.mark.django_db
def test_the_dispatcher_sends_each_request_to_the_runs_queue_once(trained_run, owner_client, monkeypatch):
    from webapp.celery_app import app

    sent = []
    # The broker send itself (a Celery message) is what tests/browser/test_newcomer.py covers with a real worker.
    monkeypatch.setattr(app, "send_task", lambda name, args, queue: sent.append((name, args, queue)))
    first = ask(owner_client, trained_run).json()["id"]
    assert dispatch_due_requests() == 1 and dispatch_due_requests() == 0
    assert sent == [("workers.playground_answer", [first], trained_run.backend.queue)]


@pytest.mark.gpu
@committed
def test_a_gpu_backends_run_is_answered_on_the_gpu(trained_run, owner_client):
    from webapp.registry.models import Backend

    Backend.objects.filter(pk=trained_run.backend_id).update(needs_gpu=True)
    asked = ask(owner_client, trained_run, max_new_tokens=6).json()
    assert answer_request(asked["id"], "gpu-worker") == "succeeded", PlaygroundRequest.objects.get().error
    state = owner_client.get(asked["url"]).json()
    assert state["device"] == "cuda" and 1 <= state["reply_tokens"] <= 6


@pytest.mark.django_db
def test_a_question_whose_worker_was_lost_says_so(trained_run, owner_client, settings):
    asked = ask(owner_client, trained_run).json()
    PlaygroundRequest.objects.filter(pk=asked["id"]).update(status="running", worker="gone@host", started_at=timezone.now())
    assert owner_client.get(asked["url"]).json()["status"] == "running"  # still within its time
    PlaygroundRequest.objects.filter(pk=asked["id"]).update(
        started_at=timezone.now() - timedelta(seconds=settings.PLAYGROUND_REPLY_SECONDS + 31))
    state = owner_client.get(asked["url"]).json()
    assert state["status"] == "failed" and "(gone@host) was lost" in state["error"]


@pytest.mark.slow  # a hung answer injected
@committed
def test_an_answer_that_takes_too_long_is_stopped(trained_run, owner_client, settings, monkeypatch):
    monkeypatch.delenv(WARM_PROCESS_ADDRESS)  # a plain child: forked, it may well answer within the second
    settings.PLAYGROUND_REPLY_SECONDS = 1  # less than a plain child needs to import torch
    asked = ask(owner_client, trained_run).json()
    assert answer_request(asked["id"], "w") == "failed"
    assert "took longer than 1 s and was stopped" in owner_client.get(asked["url"]).json()["error"]


@pytest.mark.django_db
def test_a_models_own_code_runs_only_when_an_admin_trusts_it(trained_run, make_run):
    assert trusts_remote_code(trained_run) is False
    Model.objects.filter(name="tiny-char").update(trust_remote_code=True)
    assert trusts_remote_code(trained_run) is True
    assert trusts_remote_code(make_run(model=f"run:{trained_run.pk}")) is False


@pytest.mark.django_db
def test_admins_see_requests_read_only(trained_run, owner_client, admin_client_):
    asked = ask(owner_client, trained_run).json()
    listing = admin_client_.get("/admin/playground/playgroundrequest/")
    assert listing.status_code == 200 and str(trained_run) in listing.content.decode()
    assert admin_client_.get("/admin/playground/playgroundrequest/add/").status_code == 403
    assert admin_client_.post(f"/admin/playground/playgroundrequest/{asked['id']}/change/", {"status": "succeeded"}).status_code == 403
