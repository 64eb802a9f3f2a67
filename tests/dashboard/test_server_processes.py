"""Several web server processes over one channel layer (Redis): every viewer, whichever process
holds its socket, gets each of a run's events once and in order, and the access check still holds.

Real servers (``python -m webapp.server``) on the test database, real Redis, real websocket clients;
this test process plays the training worker (``DashboardSink``, the worker's path: store + push).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from webapp import server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]

STEPS = 20


class Server:
    """``python -m webapp.server --port 0 --processes N`` on the test database; ``url`` once it listens."""

    def __init__(self, processes: int, log: Path, env: dict) -> None:
        from django.conf import settings

        self.processes, self.log = processes, log
        self.process = subprocess.Popen(server.command("127.0.0.1", 0, processes=processes, warm_checker=False),
                                        cwd=settings.BASE_DIR, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)

    def wait_ready(self) -> str:
        deadline = time.monotonic() + 120  # a hang guard: it starts in seconds
        while True:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", text)
            started = len(re.findall(r"Application startup complete|Started server process", text))
            if found and started >= self.processes:
                self.url = f"http://127.0.0.1:{found.group(1)}"
                return self.url
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the web server did not start:\n" + text[-3000:])
            time.sleep(0.2)

    def server_processes(self) -> list[int]:
        """The processes uvicorn started to serve (not multiprocessing's resource tracker)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="module")
def servers(django_db_setup, django_db_blocker, tmp_path_factory):
    """Two single-process servers (A and B) and one server of two processes, all on one Redis."""
    from django.db import connection

    from workers.processes import database_url

    with django_db_blocker.unblock():
        env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict), "DJANGO_SETTINGS_MODULE": "webapp.settings"}
    logs = tmp_path_factory.mktemp("servers")
    started = {"a": Server(1, logs / "a.log", env), "b": Server(1, logs / "b.log", env), "pair": Server(2, logs / "pair.log", env)}
    try:
        for each in started.values():
            each.wait_ready()
        yield started
    finally:
        for each in started.values():
            each.stop()


def _cookie(user) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def _open(base_url: str, run_id: int, cookie: str | None):
    """A websocket on the run, returned once its first frame (the status) came: it is relaying."""
    headers = {"Cookie": f"sessionid={cookie}"} if cookie else {}
    ws = connect(base_url.replace("http", "ws") + f"/ws/runs/{run_id}/?after=0", origin=base_url,
                 additional_headers=headers, proxy=None, max_queue=None, open_timeout=30)
    assert json.loads(ws.recv(timeout=30))["type"] == "status"
    return ws


# How long a socket must stay silent after its last step for no duplicate to be on its way (past
# the consumer's catch-up read).
QUIET_S = 2


def _steps_received(ws, through: int, timeout: float = 60, quiet: float = QUIET_S) -> list[int]:
    """Every step of ``probe`` this socket received (live or from the store's catch-up), in arrival
    order, until step ``through`` and then ``quiet`` seconds without a frame."""
    steps: list[int] = []
    deadline = time.monotonic() + timeout
    while (not steps or steps[-1] < through) and time.monotonic() < deadline:
        try:
            frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            break
        if frame["type"] == "metrics":
            steps += [step for step, _ in frame["points"].get("probe", [])]
    try:  # nothing more may come (a duplicate would)
        while True:
            frame = json.loads(ws.recv(timeout=quiet))
            if frame["type"] == "metrics":
                steps += [step for step, _ in frame["points"].get("probe", [])]
    except TimeoutError:
        pass
    return steps


def _log_steps(run_id: int, steps: int) -> None:
    """What a training worker does: log through the run's DashboardSink (stored and pushed live)."""
    from webapp.dashboard.recording import DashboardSink

    sink = DashboardSink(run_id)
    for step in range(1, steps + 1):
        sink.log_metrics(step, {"probe": step / 10})
        time.sleep(0.02)
    sink.close()


def test_each_process_delivers_every_step_once_in_order(servers, make_run, owner):
    run = make_run(status="running")
    cookie = _cookie(owner)
    sockets = {name: [_open(servers[name].url, run.pk, cookie) for _ in range(3)] for name in ("a", "b", "pair")}
    time.sleep(2)  # past the consumers' catch-up read (consumers.CATCH_UP_SECONDS), so only live frames follow
    _log_steps(run.pk, STEPS)
    received = {(name, ws): _steps_received(ws, STEPS, quiet=0) for name, opened in sockets.items() for ws in opened}
    # One quiet spell for all nine sockets, not one each: their frames queue in the client meanwhile.
    time.sleep(QUIET_S)
    for (name, ws), steps in received.items():
        steps += _steps_received(ws, 0, timeout=0, quiet=0)  # whatever came during it
        assert steps == list(range(1, STEPS + 1)), f"a socket on server {name}"
        ws.close()
    assert len(servers["pair"].server_processes()) == 2


def test_a_socket_on_another_process_sees_a_point_a_worker_published(servers, make_run, owner):
    from webapp.dashboard import series

    run = make_run(status="running")
    ws = _open(servers["b"].url, run.pk, _cookie(owner))
    _log_steps(run.pk, 1)
    assert _steps_received(ws, 1) == [1]
    assert series.points_after(run.pk, 0) == {"probe": [[1, 0.1]]}
    ws.close()


def test_strangers_and_anonymous_are_refused_on_every_process(servers, make_run, stranger):
    run = make_run(status="running")
    for name in ("a", "b", "pair"):
        for cookie in (_cookie(stranger), None):
            for _ in range(2):  # the pair's processes take connections in turn
                with pytest.raises(InvalidStatus) as refused:
                    _open(servers[name].url, run.pk, cookie)
                assert refused.value.response.status_code == 403, name
