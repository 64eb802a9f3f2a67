"""Thousands of websocket viewers of one run, against several web server processes.

``measure()`` starts the platform's web server (``webapp/server.py``, ``--processes N``) on the
database and channel layer of the calling process (it must have Django set up with REDIS_URL),
opens the viewers from client processes of their own (asyncio + aiohttp, one event loop each),
then logs metric steps as a worker does (a ``DashboardSink``: stored, and published to the
viewers, each carrying its send time) and reads when each socket received each step.

Figures:
- new connections per second: viewers / (last socket open - first handshake started), every
  client process starting at one agreed moment; a socket is open when its first frame (the run's
  status, sent after the backlog read) has come: the whole consumer's connect (the session, the
  access check, the run's backlog), as a browser opening the run page;
- push latency: publish -> a socket's receipt of the frame, over every socket and step;
- lost, duplicated and out-of-order steps per socket (each socket must get every step once, in
  order), counted once every socket has the last step or LATE_LIMIT_S has passed: late frames are
  latency, not losses. A socket the server closes reconnects with ``after=<its last step>``, as the
  run page does, and gets its gap from the store; closes are counted by code.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# How long after the last push the clients wait for late frames before counting the rest as lost.
LATE_LIMIT_S = 300


def _percentiles(samples: list[float]) -> dict:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.50), 2), "p99_ms": round(pick(0.99), 2), "max_ms": round(ordered[-1], 2)}


def _sum_counts(counts) -> dict:
    total: dict[str, int] = {}
    for one in counts:
        for key, n in one.items():
            total[key] = total.get(key, 0) + n
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_processes(pid: int) -> list[int]:
    """The processes uvicorn started under ``pid`` to serve (not multiprocessing's resource tracker)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [int(child) for child in children if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]
    except OSError:
        return []


class WebServer:
    """``python -m webapp.server --processes N`` on a free loopback port, ready when every process is."""

    def __init__(self, processes: int, log: Path) -> None:
        self.processes, self.log = processes, log

    def __enter__(self):
        from webapp import server

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            server.command("127.0.0.1", self.port, log_level="warning", processes=self.processes, warm_checker=False),
            cwd=ROOT, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        answered = 0
        # Each process answers once it has imported the app; the port is bound before any does. A
        # few dozen answers in a row spread over the processes (the kernel hands accepts around).
        while answered < 20 * self.processes:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the web server did not start: " + self.log.read_text()[-2000:])
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=5) as response:
                    answered += response.status == 200
            except OSError:
                answered = 0
                time.sleep(0.3)
        if self.processes > 1 and len(_server_processes(self.process.pid)) < self.processes:
            raise RuntimeError(f"expected {self.processes} server processes, found {_server_processes(self.process.pid)}")
        return self

    def __exit__(self, *exc):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def measure(viewers: int = 5000, server_processes: int = 4, client_processes: int = 4, pushes: int = 30,
            interval: float = 0.5, handshakes_in_flight: int = 64) -> dict:
    """Open ``viewers`` sockets on one run through ``server_processes`` server processes, publish
    ``pushes`` steps ``interval`` seconds apart, and report the figures of the module's doc."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from webapp.dashboard.recording import DashboardSink
    from webapp.runs.models import Run

    user, _ = get_user_model().objects.get_or_create(username="viewers-bench", defaults={"is_superuser": True})
    run = Run.objects.create(owner=user, name="5,000 viewers", status=Run.Status.RUNNING)
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    sink = DashboardSink(run.pk)  # stores the steps, so a socket that reconnects gets its gap from the store
    shares = [viewers // client_processes + (i < viewers % client_processes) for i in range(client_processes)]
    log = Path("/tmp") / f"bench-viewers-web-{os.getpid()}.log"
    context = multiprocessing.get_context("spawn")
    with WebServer(server_processes, log) as web:
        pipes, clients = [], []
        for share in shares:
            parent, child = context.Pipe()
            process = context.Process(target=_client, args=(child, web.port, web.url, run.pk, cookie, share,
                                                            max(1, handshakes_in_flight // client_processes)), daemon=True)
            process.start()
            pipes.append(parent)
            clients.append(process)
        for pipe in pipes:  # each client is imported and its loop running
            if not pipe.poll(120) or pipe.recv() != "ready":
                raise RuntimeError("a client process did not start")
        start_at = time.time() + 0.5
        for pipe in pipes:
            pipe.send(start_at)
        opened = [pipe.recv() if pipe.poll(1000) else {"error": "no answer in 1000 s"} for pipe in pipes]
        failures = [o["error"] for o in opened if "error" in o]
        if failures:
            raise RuntimeError(f"the viewers did not all connect: {failures}")
        connect_s = max(o["last_open"] for o in opened) - start_at
        # Each socket reads the store once more 1.5 s after it opened (consumers.CATCH_UP_SECONDS):
        # let those reads pass before measuring pushes.
        time.sleep(3)
        for step in range(1, pushes + 1):
            sink.log_metrics(step, {"bench/sent_at": time.time() * 1000})
            time.sleep(interval)
        sink.close()
        time.sleep(3)
        for pipe in pipes:
            pipe.send(pushes)  # done: how many steps each socket should have had
        reports = [pipe.recv() if pipe.poll(LATE_LIMIT_S + 120) else None for pipe in pipes]
        for process in clients:
            process.join(30)
    if any(r is None for r in reports):
        raise RuntimeError("a client process did not report its receipts")
    latencies = [x for r in reports for x in r["latencies"]]
    return {
        "viewers": viewers, "server_processes": server_processes, "client_processes": client_processes,
        "handshakes_in_flight": handshakes_in_flight,
        "connect_s": round(connect_s, 2), "new_connections_per_s": round(viewers / connect_s, 1),
        "handshake": _percentiles([x for o in opened for x in o["handshakes_ms"]]),
        "pushes": pushes, "push_interval_s": interval, "push": _percentiles(latencies),
        "expected_receipts": viewers * pushes, "received": len(latencies),
        "note": f"received: every frame that came until each socket had the last step (at most {LATE_LIMIT_S} s after "
                "the last push); a socket the server closed reconnects with after=<its last step>, as the run page does",
        "sockets_missing_steps": sum(r["missing"] for r in reports),
        "sockets_with_duplicates_or_disorder": sum(r["disordered"] for r in reports),
        "socket_closes_then_reconnects": _sum_counts(r["endings"] for r in reports),
        "target_p99_ms": 100, "target_new_connections_per_s": 500,
    }


def _client(pipe, port: int, origin: str, run_id: int, cookie: str, viewers: int, in_flight: int) -> None:
    """One client process: ``viewers`` sockets; reports opening times, then every receipt."""
    import aiohttp

    received: list[list[tuple[float, str]]] = [[] for _ in range(viewers)]
    handshakes_ms: list[float] = []
    opened_at: list[float] = []
    expected = [0]
    # How each socket's stream ended before the bench stopped reading (close code or error): a socket
    # the server closed misses every later step unless it reconnects.
    endings: dict[str, int] = {}

    async def viewer(index: int, session, gate: asyncio.Semaphore) -> None:
        inbox = received[index]
        async with gate:
            started = time.time()
            ws = await open_socket(session, 0)
            # Open once the run's status has come: the server has read the backlog and relays live events.
            first = await ws.receive()
            now = time.time()
            handshakes_ms.append((now - started) * 1000)
            opened_at.append(now)
        inbox.append((now * 1000, first.data))
        while True:
            async with ws:
                async for message in ws:
                    # Stamped on arrival, parsed after the run: parsing must not delay the frames behind.
                    inbox.append((time.time() * 1000, message.data))
                ending = f"closed {ws.close_code}" + (f" ({ws.exception()!r})" if ws.exception() else "")
            endings[ending] = endings.get(ending, 0) + 1
            # As the run page does: reconnect and ask for the steps after the last one this socket has.
            while True:
                await asyncio.sleep(0.5)
                try:
                    ws = await open_socket(session, _last_step(inbox))
                    break
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                    key = f"reconnect failed ({exc.__class__.__name__})"
                    endings[key] = endings.get(key, 0) + 1

    async def open_socket(session, after: int):
        return await session.ws_connect(f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after={after}",
                                        headers={"Origin": origin, "Cookie": f"sessionid={cookie}"},
                                        timeout=aiohttp.ClientWSTimeout(ws_close=10))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            pipe.send("ready")
            start_at = await loop.run_in_executor(None, pipe.recv)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            gate = asyncio.Semaphore(in_flight)
            tasks = [asyncio.create_task(viewer(i, session, gate)) for i in range(viewers)]
            deadline = time.monotonic() + 900
            failed = None
            while len(opened_at) < viewers and time.monotonic() < deadline and failed is None:
                failed = next((repr(t.exception()) for t in tasks if t.done() and t.exception()), None)
                await asyncio.sleep(0.05)
            if failed or len(opened_at) < viewers:
                pipe.send({"error": f"{len(opened_at)} of {viewers} opened; {failed or 'timed out'}"})
            else:
                pipe.send({"last_open": max(opened_at), "handshakes_ms": handshakes_ms})
            expected[0] = await loop.run_in_executor(None, pipe.recv)
            # Frames still on their way are late, not lost: wait until every socket has the last step
            # (at most LATE_LIMIT_S). A quiet spell is no sign that the rest is lost: on a loaded
            # machine a server process can send nothing for seconds and then deliver the rest.
            deadline = time.monotonic() + LATE_LIMIT_S
            while time.monotonic() < deadline and any(_last_step(inbox) < expected[0] for inbox in received):
                await asyncio.sleep(1)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    latencies: list[float] = []
    missing = disordered = 0
    for inbox in received:
        steps = []
        for at, text in inbox:
            data = json.loads(text)
            if data.get("type") == "metrics":
                for step, sent in data["points"].get("bench/sent_at", []):
                    steps.append(step)
                    latencies.append(at - sent)
        if steps != sorted(set(steps)):
            disordered += 1
        elif steps != list(range(1, expected[0] + 1)):
            missing += 1
    pipe.send({"latencies": latencies, "missing": missing, "disordered": disordered, "endings": endings})


def _last_step(inbox: list[tuple[float, str]]) -> int:
    """The last metric step among the frames a socket received (0: none)."""
    for _, text in reversed(inbox):
        data = json.loads(text)
        if data.get("type") == "metrics" and data["points"].get("bench/sent_at"):
            return data["points"]["bench/sent_at"][-1][0]
    return 0


if __name__ == "__main__":
    sys.exit("run through bench/scale.py viewers")
