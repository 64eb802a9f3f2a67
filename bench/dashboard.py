"""Dashboard benchmarks, all on loopback, each bounded in time. Results: bench/results/dashboard.json.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/dashboard_bench REDIS_URL=redis://127.0.0.1:6379/0 \
        python bench/dashboard.py [latency ingest query compare viewers]

Without REDIS_URL, latency and viewers go through the embedded mode's file channel layer and are
recorded as latency_file_layer and viewers_file_layer.

1. latency  trainer log() -> browser websocket receipt (headless Chromium on the run page), p50/p99
2. ingest   sustained DashboardSink ingest into the database, every point counted back
3. query    downsampled query of a 1M-point series
4. compare  compare page of 100 runs x 10k steps rendered in Chromium: navigation until all 4 charts are drawn
5. viewers  500 websocket viewers of one run (clients in a separate process), p99 push latency; the
            first push of the publishing process (it also opens the Redis connection) apart
The database named by DATABASE_URL is created if missing and migrated; its runs are deleted first.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchdb import migrated_postgres  # noqa: E402  (bench/ is the script's folder)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Playwright's sync API keeps an event loop running in the main thread; our ORM calls stay synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
RESULTS = ROOT / "bench" / "results" / "dashboard.json"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def setup_django() -> None:
    migrated_postgres()


def make_user():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": True, "is_staff": True})
    user.set_password("bench-password")
    user.save()
    return user


def make_run(user, name: str):
    from webapp.registry.models import Agent, Backend, Dataset
    from webapp.runs.models import Run

    return Run.objects.create(owner=user, name=name, agent=Agent.objects.get(name="copy-task"),
                              dataset=Dataset.objects.get(name="copy"), backend=Backend.objects.get(name="trl"),
                              status=Run.Status.RUNNING)


def session_cookie(user) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.50), 2), "p99_ms": round(pick(0.99), 2), "max_ms": round(ordered[-1], 2)}


class Web:
    """The platform's web server (webapp/server.py) on a free loopback port."""

    def __enter__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        from webapp import server

        self.process = subprocess.Popen(
            server.command("127.0.0.1", self.port, log_level="warning", processes=1),  # one process: bench/scale.py viewers has several
            cwd=ROOT, stdout=open("/tmp/bench-web.log", "wb"), stderr=subprocess.STDOUT)
        for _ in range(150):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=20)


def chromium_page(playwright, cookie: str, base_url: str):
    import shutil
    import tempfile

    context = playwright.chromium.launch_persistent_context(
        tempfile.mkdtemp(prefix="bench-chromium-"), executable_path=shutil.which("chromium"), headless=True,
        args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": "sessionid", "value": cookie, "url": base_url}])
    return context, context.new_page()


# -- 1. trainer log() -> browser receipt --------------------------------------------------------
def bench_latency(seconds: float = 20, rate: float = 50) -> dict:
    from playwright.sync_api import sync_playwright

    from webapp.dashboard.recording import DashboardSink

    user = make_user()
    run = make_run(user, "latency")
    cookie = session_cookie(user)
    with Web() as web, sync_playwright() as playwright:
        context, page = chromium_page(playwright, cookie, web.url)
        # Record the wall-clock receipt time of every websocket message carrying a bench point.
        page.add_init_script("""
          window.__receipts = [];
          const Native = window.WebSocket;
          // A subclass, so the page still finds WebSocket.OPEN and the other constants.
          window.WebSocket = class extends Native {
            constructor(url, protocols) {
              super(url, protocols);
              this.addEventListener('message', ev => {
                const now = performance.timeOrigin + performance.now();
                const msg = JSON.parse(ev.data);
                if (msg.type === 'metrics' && msg.points && msg.points['bench/sent_at'])
                  for (const [step, sent] of msg.points['bench/sent_at']) window.__receipts.push(now - sent);
              });
            }
          };""")
        page.goto(f"{web.url}/runs/{run.pk}/")
        page.wait_for_selector("#dash-live.on", timeout=30000)
        sink = DashboardSink(run.pk)
        step, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            step += 1
            sink.log_metrics(step, {"reward": step % 7 / 7, "bench/sent_at": time.time() * 1000})
            time.sleep(1 / rate)
        sink.close()
        time.sleep(1)
        receipts = page.evaluate("window.__receipts")
        context.close()
    result = percentiles(receipts)
    result.update({"logged": step, "lost": step - len(receipts), "target_p99_ms": 50})
    return result


# -- 2. sustained ingest ----------------------------------------------------------------------------
def bench_ingest(seconds: float = 10, keys: int = 100, steps_per_second: int = 1500) -> dict:
    from webapp.dashboard.recording import DashboardSink

    user = make_user()
    run = make_run(user, "ingest")
    names = [f"metric/{i}" for i in range(keys)]
    sink = DashboardSink(run.pk, flush_seconds=0.5, publish=False)
    started = time.perf_counter()
    step = 0
    while time.perf_counter() - started < seconds:
        target = int((time.perf_counter() - started) * steps_per_second)
        while step < target:
            step += 1
            sink.log_metrics(step, dict.fromkeys(names, step * 0.001))
        time.sleep(0.001)
    produced = time.perf_counter() - started
    sink.close()
    elapsed = time.perf_counter() - started
    from webapp.dashboard import series

    stored = sum(len(steps) for steps, _ in series.arrays_after(run.pk, -1).values())  # each step once
    sent = step * keys
    return {"points_sent": sent, "points_stored": stored, "lost": sent - stored, "seconds": round(elapsed, 2),
            "points_per_s": round(stored / elapsed), "offered_points_per_s": round(sent / produced), "target_points_per_s": 100_000}


# -- 3. downsampled query of a 1M-point series ---------------------------------------------------------
def bench_query(points: int = 1_000_000, repeats: int = 30) -> dict:
    import math

    from webapp.dashboard import series

    user = make_user()
    run = make_run(user, "query")
    writer = series.SeriesWriter(run.pk)
    started = time.perf_counter()
    for first in range(0, points, 100_000):
        writer.write(("reward", s, math.sin(s / 1000) + (50.0 if s == 777_777 else 0.0)) for s in range(first, first + 100_000))
    write_s = time.perf_counter() - started
    timings, zoom = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        data = series.downsample(run.pk, "reward", points=1500)
        timings.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        series.downsample(run.pk, "reward", start=400_000, end=460_000, points=1500)
        zoom.append((time.perf_counter() - t) * 1000)
    assert dict(zip(data["x"], data["y"])).get(777_777, 0) > 48, "the spike was lost"
    return {"series_points": points, "returned_points": len(data["x"]), "spike_kept": True, "write_s": round(write_s, 2),
            "full_range": percentiles(timings), "zoom_60k_steps": percentiles(zoom), "target_ms": 100}


# -- 4. compare chart of 100 runs x 10k steps in Chromium ------------------------------------------------
def bench_compare(runs: int = 100, steps: int = 10_000) -> dict:
    import math

    from playwright.sync_api import sync_playwright

    from webapp.dashboard.series import SeriesWriter

    user = make_user()
    ids = []
    for i in range(runs):
        run = make_run(user, f"compare-{i}")
        ids.append(run.pk)
        SeriesWriter(run.pk).write(
            (key, s, math.sin(s / 500 + i) * scale + i / runs)
            for key, scale in (("reward", 1.0), ("loss", 2.0), ("kl", 0.1), ("response_length", 30.0)) for s in range(steps))
    cookie = session_cookie(user)
    url_runs = ",".join(map(str, ids))
    timings = []
    with Web() as web, sync_playwright() as playwright:
        context, page = chromium_page(playwright, cookie, web.url)
        for _ in range(3):
            started = time.perf_counter()
            page.goto(f"{web.url}/dashboard/compare/?runs={url_runs}")
            page.wait_for_selector("body[data-compare-rendered='1']", timeout=60000)
            timings.append((time.perf_counter() - started) * 1000)
            traces = page.evaluate("[...document.querySelectorAll('.dash-chart')].map(d => +d.dataset.traces)")
            points = page.evaluate("Math.max(...compareState.charts.flatMap(c => c.runs.map(r => r.x.length)))")
        context.close()
    return {"runs": runs, "steps": steps, "charts": len(traces), "traces_per_chart": traces, "max_points_per_trace": points,
            "navigation_to_rendered_ms": [round(t) for t in timings], "median_ms": round(statistics.median(timings)), "target_ms": 2000}


# -- 5. 500 viewers of one run ------------------------------------------------------------------------
def bench_viewers(viewers: int = 500, pushes: int = 40, interval: float = 0.5) -> dict:
    import multiprocessing

    from webapp.dashboard import live

    user = make_user()
    run = make_run(user, "viewers")
    cookie = session_cookie(user)
    live.publisher()  # as a run's DashboardSink does when the run starts
    with Web() as web:
        # The viewers run in a process of their own: a client sharing the server's interpreter adds
        # its own per-message work to every measured push.
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(target=viewer_process, args=(child, web.port, web.url, run.pk, cookie, viewers), daemon=True)
        process.start()
        if not parent.poll(180):
            raise RuntimeError("the viewers did not report")
        opened = parent.recv()
        if opened != viewers:
            raise RuntimeError(f"the viewers did not all connect: {opened}")
        # The first push of a process also opens its Redis connection (a worker pays that once, at its
        # first logged step): measured on its own, not among the steady pushes.
        live.publish_metrics(run.pk, 1, {"bench/cold_sent_at": time.time() * 1000})
        live.publisher().flush()
        time.sleep(2)  # past the consumers' catch-up read
        for step in range(2, pushes + 2):
            live.publish_metrics(run.pk, step, {"bench/sent_at": time.time() * 1000})
            time.sleep(interval)
        live.publisher().flush()
        time.sleep(2)
        parent.send("done")
        latencies, cold = parent.recv() if parent.poll(60) else ([], [])
        process.join(30)
    result = percentiles(latencies)
    result.update({"viewers": viewers, "pushes": pushes, "expected_receipts": viewers * pushes,
                   "lost": viewers * pushes - len(latencies), "client": "one separate process, 16 handshakes at a time",
                   "target_p99_ms": 100, "cold_first_push": percentiles(cold)})
    return result


def viewer_process(pipe, port: int, origin: str, run_id: int, cookie: str, viewers: int) -> None:
    """Open ``viewers`` websockets on the run; report how many opened, then (on "done") the latencies."""
    import aiohttp

    latencies: list[float] = []
    received: list[tuple[float, str]] = []

    async def viewer(session, opened, handshakes):
        async with handshakes:  # a stream of connections, not all at once: each one reads the database
            ws = await session.ws_connect(f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?after=0",
                                          headers={"Origin": origin, "Cookie": f"sessionid={cookie}"})
        async with ws:
            opened.append(1)
            async for message in ws:
                # Stamped on arrival, parsed after the run: the client's own JSON work must not delay
                # the stamps of the frames behind it.
                received.append((time.time() * 1000, message.data))

    async def all_viewers():
        opened: list[int] = []
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            handshakes = asyncio.Semaphore(16)
            tasks = [asyncio.create_task(viewer(session, opened, handshakes)) for _ in range(viewers)]
            deadline = time.monotonic() + 120
            failed = None
            while len(opened) < viewers and time.monotonic() < deadline and failed is None:
                failed = next((repr(t.exception()) for t in tasks if t.done()), None)
                await asyncio.sleep(0.1)
            pipe.send(len(opened) if failed is None else f"{len(opened)} opened, then {failed}")
            await loop.run_in_executor(None, pipe.recv)  # "done"
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        cold: list[float] = []
        for at, text in received:
            data = json.loads(text)
            if data["type"] == "metrics":
                for key, into in (("bench/sent_at", latencies), ("bench/cold_sent_at", cold)):
                    into.extend(at - sent for _, sent in data["points"].get(key, []))
        pipe.send((latencies, cold))

    asyncio.run(all_viewers())


LAYER_BENCHES = ("latency", "viewers")
BENCHES = {"latency": bench_latency, "ingest": bench_ingest, "query": bench_query, "compare": bench_compare, "viewers": bench_viewers}


def main(names: list[str]) -> None:
    setup_django()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    from django.conf import settings

    # Without REDIS_URL the platform runs on its embedded channel layer (files): the benches that
    # go through the layer record under their own names then.
    layer = settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1]
    for name in names or list(BENCHES):
        started = time.perf_counter()
        key = name if layer == "RedisChannelLayer" or name not in LAYER_BENCHES else f"{name}_file_layer"
        results[key] = {**BENCHES[name](), "channel_layer": layer}
        results[key]["bench_seconds"] = round(time.perf_counter() - started, 1)
        print(key, json.dumps(results[key]), flush=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
