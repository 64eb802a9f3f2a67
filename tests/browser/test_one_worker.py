"""`make run`'s one worker, as a person sees it (the embedded platform: SQLite, the file broker): while
a run trains on the only run slot, the playground answers a question to an earlier run's model
(the playground has a worker of its own), a run queued behind says behind which run it waits, and
/fleet/ shows the slots and what each queue holds."""

from __future__ import annotations

import re
import time

import pytest
import requests

pytestmark = pytest.mark.browser

# One web process (the default is two, each with its run checker): these tests are about the worker's
# slot, and a second web process would only add its start-up to their CPU. The workers keep `make run`'s
# default, a warm process each (tests/conftest.py turns it off for the workers tests start): their runs
# and answers are forked, as a person's are.
ONE_WORKER = {"WEB_PROCESSES": "1", "RUN_WARM_PROCESS": "1"}
TINY = {"data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2, "data.max_response_length": 4}


class Api:
    def __init__(self, url: str, login: tuple[str, str]) -> None:
        self.url = url
        token = requests.post(f"{url}/api/token/", json={"username": login[0], "password": login[1]}, timeout=30).json()["token"]
        self.headers = {"Authorization": f"Token {token}"}

    def create(self, name: str, steps: int) -> dict:
        body = {"name": name, "agent": "copy-task", "dataset": "copy", "reward": "char-accuracy", "backend": "trl",
                "model": "tiny-char", "overrides": {**TINY, "trainer.total_training_steps": steps}}
        response = requests.post(f"{self.url}/api/runs/", json=body, headers=self.headers, timeout=120)
        assert response.status_code == 201, response.text
        return response.json()

    def run(self, pk: int) -> dict:
        return requests.get(f"{self.url}/api/runs/{pk}/", headers=self.headers, timeout=30).json()

    def wait(self, pk: int, done, what: str, timeout: float = 180) -> dict:
        deadline = time.monotonic() + timeout
        while not done(run := self.run(pk)):
            assert time.monotonic() < deadline, f"run {pk} never {what}: {run}"
            time.sleep(0.5)
        return run

    def trained_and_training(self) -> tuple[dict, dict]:
        """A run that has ended with a final model, and a long one that holds the worker's slot."""
        trained = self.create("trained", steps=2)
        self.wait(trained["id"], lambda r: r["status"] == "succeeded", "succeeded")
        long = self.create("long", steps=5000)
        self.wait(long["id"], lambda r: r["status"] == "running" and r["steps"] >= 1, "trained a step")
        return trained, long


@pytest.mark.parametrize("embedded_platform", [{"args": ["--no-demo-run"], "env": ONE_WORKER}], indirect=True)
def test_the_playground_answers_while_a_run_trains_and_a_queued_run_says_what_it_waits_behind(
        embedded_platform, browser, log_in, tail):
    url = embedded_platform["url"]
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        api = Api(url, embedded_platform["login"])
        trained, long = api.trained_and_training()
        behind = api.create("behind", steps=2)

        log_in(page, url, *embedded_platform["login"])
        # The queued run's page says where it is and behind what, in words.
        page.goto(f"{url}/runs/{behind['id']}/")
        eta = page.locator("#run-eta")
        assert re.fullmatch(rf"Queued: 1st in the 'cpu' queue \(1 of 1 slot busy\), behind run #{long['id']} "
                            rf"\(training, step \d+/5000\)\.", eta.text_content().strip()), eta.text_content()
        page.goto(f"{url}/")
        assert f"behind run #{long['id']} (training, step" in page.locator(f"tr[data-run='{behind['id']}']").text_content()
        assert api.run(behind["id"])["waiting"].startswith("Queued: 1st in the 'cpu' queue")

        # The workers page: the runs' worker has its one slot busy, the playground's is free; the cpu
        # queue trains one run and holds one.
        page.goto(f"{url}/fleet/")
        runs_worker = page.locator("#workers tr", has_text="embedded@")
        assert "1 busy of 1" in runs_worker.locator(".slots").text_content()
        assert "0 busy of 1" in page.locator("#workers tr", has_text="playground@").locator(".slots").text_content()
        cpu = page.locator("#queue-cpu")
        assert cpu.locator(".slots").text_content() == "1 of 1"
        assert cpu.locator(".running").text_content() == "1" and cpu.locator(".queued").text_content().startswith("1")
        assert page.locator("#queue-playground .questions").text_content() == "0"

        # The playground answers a question to the trained run's model while the long run trains.
        page.goto(f"{url}/runs/{trained['id']}/playground/")
        assert "answers while runs train" in page.text_content("#playground-about")
        page.fill("#chat-input", "abc")
        page.click("#chat-send")
        page.wait_for_selector(".chat-assistant", timeout=120_000)
        assert "Answered by playground@" in page.text_content("#playground-status")
        assert api.run(long["id"])["status"] == "running" and api.run(behind["id"])["status"] == "queued"

        requests.post(f"{url}/api/runs/{long['id']}/cancel/", headers=api.headers, timeout=30)
        requests.post(f"{url}/api/runs/{behind['id']}/cancel/", headers=api.headers, timeout=30)
    except Exception:
        print("platform log:\n" + tail(embedded_platform["log"]))
        raise
    finally:
        page.close()


@pytest.mark.parametrize("embedded_platform", [{"args": ["--no-demo-run", "--playground-queue="], "env": ONE_WORKER}],
                         indirect=True)
def test_without_its_own_worker_a_question_says_which_run_it_waits_behind(embedded_platform, browser, log_in, tail):
    """As with workers started by hand (no PLAYGROUND_QUEUE): a question takes a slot of the runs' queue,
    so it waits behind the run that holds it, says so with its place, and is answered once the run ends."""
    url = embedded_platform["url"]
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        api = Api(url, embedded_platform["login"])
        trained, long = api.trained_and_training()

        log_in(page, url, *embedded_platform["login"])
        page.goto(f"{url}/runs/{trained['id']}/playground/")
        assert "waits behind them" in page.text_content("#playground-about")
        page.fill("#chat-input", "abc")
        page.click("#chat-send")
        page.wait_for_function("() => document.getElementById('playground-status').textContent.startsWith('Waiting behind')")
        status = page.text_content("#playground-status")
        assert re.fullmatch(rf"Waiting behind run #{long['id']} \(training, step \d+/5000\): position 1 in the 'cpu' queue "
                            r"\(1 of 1 slot busy\)\. It waits up to 120 s\.", status), status

        requests.post(f"{url}/api/runs/{long['id']}/cancel/", headers=api.headers, timeout=30)
        page.wait_for_selector(".chat-assistant", timeout=120_000)  # the slot is free again: it answers
        assert "Answered by embedded@" in page.text_content("#playground-status")
    except Exception:
        print("platform log:\n" + tail(embedded_platform["log"]))
        raise
    finally:
        page.close()
