"""Scale benchmarks of the metric store. Results: bench/results/scale.json.

    python bench/scale.py [worker capacity capacity_many slowdown wal runpage query summaries viewers compare]      (default: all of them)

Each part runs against a PostgreSQL cluster of its own, created here (``initdb`` into a temporary
folder, started as the ``postgres`` user on a free loopback port, removed at the end), so that
the WAL counted is this benchmark's alone and neighbours' databases do not share its buffers; the
machine's CPUs are still shared, and the load average is recorded beside the figures.

1. worker    points/s through the real worker path: DashboardSink (and the log-only DatabaseSink)
             with 100 keys, the producer as fast as it goes, every point counted back
   capacity  several runs written at once, each by its own process: the points/s one PostgreSQL
             takes here, and so how many runs of 100 keys x 10 steps/s it holds
   capacity_many  200 runs flushed in turn (5 steps x 100 keys a flush) from 4 processes: the
             flushes/s it takes, the limit when many runs each log at a training loop's pace
2. slowdown  a training loop of fixed torch work at ~10 steps/s logging 100 keys, with and without
             the sinks, alternated in pairs: median of per-pair slowdowns
3. wal       WAL bytes per stored point at 4 steps/s x 100 keys (flush every 0.5 s, i.e. every 2
             steps; time is simulated: the flushes carry what they would, back to back, with a
             checkpoint every 300 simulated seconds as PostgreSQL's default does)
4. runpage   run page and share page of a running run with 10M points (100 keys x 100k steps)
5. query     downsampled query of a 10M-point series: full range and zoomed ranges, p99
6. summaries a 100M-point series stored (blocks by COPY, summarised, the last 200k points through the
             writer) and charted through the downsampled query: full range and zoomed, p50/p99
7. viewers   5,000 websocket viewers of one run through 4 web server processes over Redis, opened
             from 4 client processes (bench/viewer_load.py): new connections/s, then push p99 over
             30 steps, every socket checked for each step once and in order. Needs REDIS_URL:
                 REDIS_URL=redis://127.0.0.1:6379/0 python bench/scale.py viewers
             BENCH_VIEWERS and BENCH_SERVER_PROCESSES change the counts (the headline keys are
             filled only at 5,000 viewers).
8. compare   the compare page of 1,000 runs x 10k steps (4 keys) in headless Chromium: navigation
             until every chart is drawn (the page's marker after each Plotly.react), 3 navigations,
             the first cold; the web server (webapp/server.py) runs on this part's cluster. Twice:
             with the series cache off (every series read from the store), then on (the first
             navigation fills it). With REDIS_URL the cache is Redis, shared by the server processes:
                 REDIS_URL=redis://127.0.0.1:6379/0 python bench/scale.py compare
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
RESULTS = ROOT / "bench" / "results" / "scale.json"
KEYS = 100


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free loopback port (run as the ``postgres`` user)."""

    def __enter__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="scale-pg-"))
        shutil.chown(self.folder, "postgres")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        data = self.folder / "data"
        self._as_postgres(["initdb", "-D", str(data), "--auth=trust", "-U", "postgres"])
        self._as_postgres(["pg_ctl", "-D", str(data), "-l", str(self.folder / "log"), "-w", "start",
                           "-o", f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"])
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/scale"
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True) as conn:
            conn.execute("create database scale")
        return self

    def _as_postgres(self, command: list[str]) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.STDOUT)

    def __exit__(self, *exc):
        self._as_postgres(["pg_ctl", "-D", str(self.folder / "data"), "-m", "fast", "stop"])
        shutil.rmtree(self.folder, ignore_errors=True)


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_run(name: str, status: str = "running"):
    from django.contrib.auth import get_user_model

    from webapp.runs.models import Run

    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": True, "is_staff": True})
    return Run.objects.create(owner=user, name=name, status=status)


def stored_count(run_id: int, skip: tuple[str, ...] = ()) -> int:
    from webapp.dashboard import series

    return sum(len(steps) for key, (steps, _) in series.arrays_after(run_id, -1).items() if key not in skip)


def percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.50), 2), "p99_ms": round(pick(0.99), 2), "max_ms": round(ordered[-1], 2)}


def wal_lsn() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def checkpoint() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("checkpoint")


# -- 1. the worker path ----------------------------------------------------------------------------
def _worker_path(seconds: float, steps_per_second: int | None) -> dict:
    from webapp.dashboard.recording import DashboardSink
    from webapp.runs.recording import DatabaseSink, RunRecorder

    run = make_run("worker path")
    names = [f"metric/{i}" for i in range(KEYS)]
    recorder = RunRecorder(run.pk).start()
    publish = bool(os.environ.get("REDIS_URL"))
    sinks = [DatabaseSink(recorder), DashboardSink(run.pk, publish=publish)]
    started = time.perf_counter()
    step = 0
    while (now := time.perf_counter() - started) < seconds:
        target = int(now * steps_per_second) if steps_per_second else step + 1
        while step < target:
            step += 1
            metrics = dict.fromkeys(names, step * 0.001)
            for sink in sinks:
                sink.log_metrics(step, metrics)
        if steps_per_second:
            time.sleep(0.002)
    produced = time.perf_counter() - started
    for sink in sinks:
        sink.close()
    recorder.close()
    elapsed = time.perf_counter() - started
    sent, stored = step * KEYS, stored_count(run.pk, skip=("overload/dropped_points",))
    return {"offered_points_per_s": round(sent / produced), "points_sent": sent, "points_stored": stored,
            "dropped": sinks[1].dropped, "lost": sent - stored - sinks[1].dropped,
            "seconds_until_all_stored": round(elapsed, 2), "points_per_s": round(stored / elapsed), "live_push": publish}


def bench_worker(seconds: float = 15) -> dict:
    """The producer paced at 200k and 400k points/s, then unpaced (as fast as it goes): the
    sustained figure is the best stored rate among runs that dropped nothing."""
    runs = {f"paced_{rate // 1000}k": _worker_path(seconds, rate // KEYS) for rate in (200_000, 400_000)}
    runs["unpaced"] = _worker_path(seconds, None)
    clean = [r["points_per_s"] for r in runs.values() if r["dropped"] == 0 and r["lost"] == 0]
    return {"keys": KEYS, "runs": runs, "sustained_points_per_s": max(clean) if clean else None,
            "best_stored_points_per_s": max(r["points_per_s"] for r in runs.values()), "target_points_per_s": 200_000}


# -- 1b. what one PostgreSQL holds: several runs written at once ---------------------------------------
def _flood(seconds: float) -> tuple[int, float]:
    """In a process of its own: one run's DashboardSink, 100 keys, as fast as it goes."""
    import django

    django.setup()
    from webapp.dashboard.recording import DashboardSink

    run = make_run("capacity")
    names = [f"metric/{i}" for i in range(KEYS)]
    sink = DashboardSink(run.pk, publish=False)
    started = time.perf_counter()
    step = 0
    while time.perf_counter() - started < seconds:
        step += 1
        sink.log_metrics(step, dict.fromkeys(names, step * 0.001))
        if step % 100 == 0:
            time.sleep(0.005)  # let the writer thread take the lock now and then, as a real loop does
    sink.close()
    return stored_count(run.pk), time.perf_counter() - started


def bench_capacity(processes: int = 4, seconds: float = 15) -> dict:
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        started = time.perf_counter()
        results = pool.map(_flood, [seconds] * processes)
        elapsed = time.perf_counter() - started
    stored = sum(n for n, _ in results)
    per_s = stored / elapsed
    return {"writer_processes": processes, "points_stored": stored, "seconds": round(elapsed, 2),
            "points_per_s": round(per_s), "runs_at_100_keys_x_10_steps_per_s": int(per_s // 1000),
            "note": "each process floods its own run; CPU (2 cores shared by writers, PostgreSQL and other work) is the limit"}


def _flushes(runs: int, seconds: float) -> tuple[int, int, float]:
    """In a process of its own: ``runs`` runs, each flushed in turn with half a second of a run
    logging 100 keys at 10 steps/s (5 steps, 500 points), as their writers would; as fast as it goes."""
    import django

    django.setup()
    from webapp.dashboard.series import SeriesWriter

    writers = [SeriesWriter(make_run(f"many-{i}").pk) for i in range(runs)]
    names = [f"metric/{i}" for i in range(KEYS)]
    started = time.perf_counter()
    rounds = 0
    while time.perf_counter() - started < seconds:
        rounds += 1
        for writer in writers:
            writer.write_steps([(rounds * 5 + i, dict.fromkeys(names, random.random())) for i in range(5)])
    elapsed = time.perf_counter() - started
    return rounds * runs, rounds * runs * 5 * KEYS, elapsed


def bench_capacity_many(processes: int = 4, runs_per_process: int = 50, seconds: float = 15) -> dict:
    """Many runs at the rate a training loop logs: how many flushes (one per run every 0.5 s) one
    PostgreSQL takes per second here, and so how many runs of 100 keys x 10 steps/s it holds."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        results = pool.starmap(_flushes, [(runs_per_process, seconds)] * processes)
    flushes = sum(f for f, _, _ in results) / max(e for _, _, e in results)
    points = sum(p for _, p, _ in results) / max(e for _, _, e in results)
    return {"writer_processes": processes, "runs": processes * runs_per_process, "flushes_per_s": round(flushes),
            "points_per_s": round(points), "runs_at_100_keys_x_10_steps_per_s": int(flushes // 2),
            "note": "each flush: 5 steps x 100 keys; a run flushes every 0.5 s, so runs held = flushes/s / 2"}


# -- 2. training slowdown ------------------------------------------------------------------------------
def bench_slowdown(pairs: int = 5, steps: int = 60) -> dict:
    import torch

    from webapp.dashboard.recording import DashboardSink
    from webapp.runs.recording import DatabaseSink, RunRecorder

    torch.set_num_threads(1)  # as the example configs train (trainer.cpu_threads=1)
    weights = torch.randn(384, 384)
    names = [f"metric/{i}" for i in range(KEYS)]

    def work() -> None:  # about a tenth of a second of matrix products on one thread, fixed
        x = torch.randn(384, 384)
        for _ in range(30):
            x = torch.tanh(x @ weights)

    def loop(with_sinks: bool) -> float:
        sinks, recorder = [], None
        if with_sinks:
            run = make_run("slowdown")
            recorder = RunRecorder(run.pk).start()
            sinks = [DatabaseSink(recorder), DashboardSink(run.pk, publish=bool(os.environ.get("REDIS_URL")))]
        started = time.perf_counter()
        for step in range(1, steps + 1):
            work()
            metrics = {name: random.random() for name in names}
            for sink in sinks:
                sink.log_metrics(step, metrics)
        took = time.perf_counter() - started
        for sink in sinks:
            sink.close()
        if recorder:
            recorder.close()
        return took

    loop(False)  # warm up
    ratios, bare, sinked = [], [], []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        took = {flag: loop(flag) for flag in order}
        bare.append(took[False])
        sinked.append(took[True])
        ratios.append(took[True] / took[False])
    ordered = sorted(ratios)
    return {"pairs": pairs, "steps_per_loop": steps, "steps_per_s_bare": round(steps / statistics.median(bare), 2),
            "per_pair_slowdown_pct": [round((r - 1) * 100, 2) for r in ratios],
            "median_slowdown_pct": round((statistics.median(ratios) - 1) * 100, 2),
            "range_pct": [round((ordered[0] - 1) * 100, 2), round((ordered[-1] - 1) * 100, 2)], "target_pct": 2}


# -- 3. WAL per point at 4 steps/s ----------------------------------------------------------------------
def bench_wal(simulated_seconds: int = 1200) -> dict:
    from webapp.dashboard.recording import DashboardSink

    run = make_run("wal")
    names = [f"metric/{i}" for i in range(KEYS)]
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False)  # flushed below, every 2 steps
    checkpoint()
    before = wal_lsn()
    step = 0
    for second in range(simulated_seconds):
        if second and second % 300 == 0:
            checkpoint()  # checkpoint_timeout's default: the first change to each page after it is a full page
        for _ in range(2):  # two flushes a second, two steps each
            for _ in range(2):
                step += 1
                sink.log_metrics(step, {name: random.random() for name in names})
            sink.flush()
    sink.close()
    wal = wal_lsn() - before
    stored = stored_count(run.pk)
    return {"simulated_seconds": simulated_seconds, "steps": step, "points": stored, "wal_bytes": wal,
            "wal_bytes_per_point": round(wal / stored, 1), "target_bytes_per_point": 50}


# -- 4. run page and share page at 10M points -------------------------------------------------------------
def fill(run_id: int, keys: list[str], steps: int, steps_per_write: int) -> float:
    from webapp.dashboard.series import SeriesWriter

    writer = SeriesWriter(run_id)
    started = time.perf_counter()
    for first in range(1, steps + 1, steps_per_write):
        writer.write((key, step, math.sin(step / 1000 + k)) for step in range(first, min(first + steps_per_write, steps + 1))
                     for k, key in enumerate(keys))
    return time.perf_counter() - started


def bench_runpage(steps: int = 100_000, repeats: int = 40) -> dict:
    from django.test import Client

    from webapp.teams.models import ShareLink

    from webapp.warmup import warm_up

    run = make_run("10M points")
    write_s = fill(run.pk, [f"metric/{i}" for i in range(KEYS - 2)] + ["reward", "loss"], steps, 100)
    link = ShareLink.objects.create(run=run, created_by=run.owner)
    # Started as a server process starts (webapp/asgi.py): its middleware loaded and warm_up() done.
    warm_up_s = warm_up()
    client = Client(HTTP_HOST="127.0.0.1")
    client.handler.load_middleware()
    client.force_login(run.owner)
    timings: dict[str, list[float]] = {"run_page": [], "share_page": []}
    # This process's CPU time per request as well: under load the wall time is mostly waiting for a
    # core, while the CPU time still shows what a request computes (a cold one: imports, compiling).
    cpu: dict[str, list[float]] = {"run_page": [], "share_page": []}
    for _ in range(repeats):
        for name, url in (("run_page", f"/runs/{run.pk}/"), ("share_page", f"/share/{link.token}/")):
            t, c = time.perf_counter(), time.process_time()
            response = client.get(url)
            timings[name].append((time.perf_counter() - t) * 1000)
            cpu[name].append((time.process_time() - c) * 1000)
            assert response.status_code == 200, (url, response.status_code)
    return {"points": KEYS * steps, "fill_s": round(write_s, 1), "warm_up_s": round(warm_up_s, 2),
            "first_run_page_ms": round(timings["run_page"][0], 2), "first_share_page_ms": round(timings["share_page"][0], 2),
            **{k: percentiles(v) for k, v in timings.items()},
            "cpu_ms": {k: {"first": round(v[0], 2), "p50": round(statistics.median(v), 2)} for k, v in cpu.items()},
            "target_ms": 100}


# -- 5. downsampled query of a 10M-point series ----------------------------------------------------------------
def bench_query(points: int = 10_000_000, repeats: int = 100) -> dict:
    from webapp.dashboard import series

    run = make_run("10M-point series")
    write_s = fill(run.pk, ["reward"], points, 100_000)
    full, zoom = [], []
    rng = random.Random(3)
    for _ in range(repeats):
        t = time.perf_counter()
        data = series.downsample(run.pk, "reward", points=1500)
        full.append((time.perf_counter() - t) * 1000)
        start = rng.randrange(points)
        t = time.perf_counter()
        series.downsample(run.pk, "reward", start=start, end=start + rng.choice([10_000, 100_000, 1_000_000]), points=1500)
        zoom.append((time.perf_counter() - t) * 1000)
    assert data["count"] == points
    return {"series_points": points, "returned_points": len(data["x"]), "write_s": round(write_s, 1),
            "full_range": percentiles(full), "zoomed": percentiles(zoom), "all": percentiles(full + zoom), "target_ms": 50}


# -- 6. a 100M-point series: stored in blocks, summarised, charted ---------------------------------------
def bench_summaries(points: int = 100_000_000, through_writer: int = 200_000, repeats: int = 50) -> dict:
    """One key of 100M points. All but the last ``through_writer`` points are cut into blocks by
    the store's own ``block_row`` and loaded with COPY (the writer would take ~10 minutes here);
    the store's ``rebuild_summaries`` summarises them; the rest goes through ``SeriesWriter``, whose
    folds keep the summaries. The chart is then read through ``series.downsample``, the query path
    of the series endpoint: full range (from the summaries) and zoomed ranges."""
    import numpy as np
    import psycopg
    from django.db import connection

    from webapp.dashboard import series
    from webapp.dashboard.models import BLOCK_SIZE, SeriesBlock, SeriesSummary

    run = make_run("100M-point series")
    spikes = {points // 8 + 3: 1000.0, points * 7 // 8 + 5: -1000.0}  # one point each: the chart must keep them
    loaded = points - through_writer
    table = SeriesBlock._meta.db_table
    columns = ("run_id", "key", "index", "first_step", "last_step", "count", "min_value", "min_step", "max_value",
               "max_step", "last_value", "steps", "values")
    types = ("int8", "text", "int4", "int8", "int8", "int4", "float8", "int8", "float8", "int8", "float8", "bytea", "bytea")
    wal_before = wal_lsn()
    started = time.perf_counter()
    connection.ensure_connection()
    chunk = BLOCK_SIZE * 1000
    with connection.cursor() as cursor, psycopg.Cursor(connection.connection) as raw:
        quoted = ", ".join(f'"{column}"' for column in columns)
        with raw.copy(f"copy {table} ({quoted}) from stdin (format binary)") as copy:
            copy.set_types(types)
            index = 0
            for first in range(0, loaded, chunk):
                steps = np.arange(first, min(first + chunk, loaded), dtype="<i8")
                values = np.sin(steps / 50_000.0) + 0.1 * np.sin(steps / 7.0)
                for step, value in spikes.items():
                    if steps[0] <= step <= steps[-1]:
                        values[step - first] = value
                for a in range(0, len(steps), BLOCK_SIZE):
                    block = series.block_row(run.pk, "reward", index, steps[a:a + BLOCK_SIZE], values[a:a + BLOCK_SIZE])
                    copy.write_row([getattr(block, f) for f in columns])
                    index += 1
        cursor.execute("analyze " + table)
    copied_s = time.perf_counter() - started
    summaries = series.rebuild_summaries(run.pk)
    summarised_s = time.perf_counter() - started - copied_s
    writer = series.SeriesWriter(run.pk)
    for first in range(loaded, points, 10_000):
        writer.write(("reward", step, math.sin(step / 50_000.0)) for step in range(first, min(first + 10_000, points)))
    writer.fold()
    store_s = time.perf_counter() - started
    wal = wal_lsn() - wal_before
    with connection.cursor() as cursor:
        cursor.execute("select pg_total_relation_size(%s), pg_total_relation_size(%s)", [table, SeriesSummary._meta.db_table])
        block_bytes, summary_bytes = cursor.fetchone()

    full, zoom = [], []
    rng = random.Random(5)
    for _ in range(repeats):
        t = time.perf_counter()
        chart = series.downsample(run.pk, "reward", points=1500)
        full.append((time.perf_counter() - t) * 1000)
        width = rng.choice([w for w in (100_000, 1_000_000, 10_000_000, 50_000_000) if w < points])
        start = rng.randrange(points - width)
        t = time.perf_counter()
        series.downsample(run.pk, "reward", start=start, end=start + width, points=1500)
        zoom.append((time.perf_counter() - t) * 1000)
    assert chart["count"] == points, chart["count"]
    shown = dict(zip(chart["x"], chart["y"]))
    assert all(shown.get(step) == value for step, value in spikes.items()), "a spike is missing from the chart"
    assert chart["x"][-1] == points - 1
    return {"series_points": points, "blocks": SeriesBlock.objects.filter(run=run).count(), "summaries": summaries,
            "loaded_by_copy": loaded, "through_writer": through_writer, "copy_s": round(copied_s, 1),
            "summaries_s": round(summarised_s, 1), "store_s": round(store_s, 1), "wal_bytes": wal,
            "block_table_bytes": block_bytes, "summary_table_bytes": summary_bytes, "returned_points": len(chart["x"]),
            "full_range": percentiles(full), "zoomed": percentiles(zoom), "all": percentiles(full + zoom)}


BENCHES = {"worker": bench_worker, "capacity": bench_capacity, "capacity_many": bench_capacity_many, "slowdown": bench_slowdown, "wal": bench_wal, "runpage": bench_runpage, "query": bench_query, "summaries": bench_summaries}


# -- 6. 5,000 viewers of one run over several web server processes ------------------------------------------
def bench_viewers(viewers: int = 5000) -> dict:
    """bench/viewer_load.py: 4 server processes over Redis, 4 client processes, 30 pushes."""
    if not os.environ.get("REDIS_URL"):
        raise RuntimeError("the viewers part needs REDIS_URL (the channel layer the server processes share)")
    from viewer_load import measure  # bench/ is the script's folder

    return measure(viewers=int(os.environ.get("BENCH_VIEWERS", viewers)),
                   server_processes=int(os.environ.get("BENCH_SERVER_PROCESSES", 4)))


BENCHES["viewers"] = bench_viewers


# -- 8. compare page of 1,000 runs x 10k steps in Chromium ------------------------------------------------
COMPARE_CHART_KEYS = (("reward", 1.0), ("loss", 2.0), ("kl", 0.1), ("response_length", 30.0))


def fill_compare_runs(owner, runs: int, steps: int) -> list[int]:
    """``runs`` ended runs, each with the compare page's four keys at every step: blocks built by the
    store's own ``block_row`` and inserted in bulk, the latest values on each run's row as the
    writer keeps them (a run that ended has folded its tail into such blocks)."""
    import numpy as np

    from webapp.dashboard.models import BLOCK_SIZE, SeriesBlock
    from webapp.dashboard.series import block_row
    from webapp.runs.models import Run

    made = Run.objects.bulk_create([Run(owner=owner, name=f"compare-{i}", status="succeeded", steps=steps - 1)
                                    for i in range(runs)])
    step_array = np.arange(steps, dtype="<i8")
    blocks, latest = [], {}
    for i, run in enumerate(made):
        values_of = {}
        for key, scale in COMPARE_CHART_KEYS:
            values = np.sin(step_array / 500 + i) * scale + i / runs
            values_of[key] = float(values[-1])
            blocks.extend(block_row(run.pk, key, n, step_array[first:first + BLOCK_SIZE], values[first:first + BLOCK_SIZE])
                          for n, first in enumerate(range(0, steps, BLOCK_SIZE)))
        latest[run.pk] = values_of
        if len(blocks) >= 4000:
            SeriesBlock.objects.bulk_create(blocks)
            blocks = []
    SeriesBlock.objects.bulk_create(blocks)
    for run in made:
        run.latest_values = latest[run.pk]
    Run.objects.bulk_update(made, ["latest_values"], batch_size=500)
    return [run.pk for run in made]


def bench_compare(runs: int = 1000, steps: int = 10_000, repeats: int = 3) -> dict:
    """From navigation (``page.goto``) until the page says every chart is drawn (each chart's
    Plotly.react resolved and a frame painted after it), in headless Chromium (WebGL on the CPU:
    SwiftShader). The first navigation is cold (Plotly fetched and compiled, the server's first
    queries); the median is of the warm ones."""
    owner = make_run("compare owner").owner
    started = time.perf_counter()
    ids = fill_compare_runs(owner, runs, steps)
    fill_s = time.perf_counter() - started
    # Without the series cache: every navigation's series read from the store (the first view of
    # these runs); with it: the first navigation fills it, the later ones read it.
    uncached = measure_compare(owner, ids, repeats, {"SERIES_CACHE_SECONDS": "0"})
    measured = measure_compare(owner, ids, repeats, {})
    warm = measured["navigation_to_drawn_ms"][1:] or measured["navigation_to_drawn_ms"]
    warm_uncached = uncached["navigation_to_drawn_ms"][1:] or uncached["navigation_to_drawn_ms"]
    return {"runs": runs, "steps": steps, "keys": [k for k, _ in COMPARE_CHART_KEYS], "fill_s": round(fill_s, 1),
            "series_cache": "redis" if os.environ.get("REDIS_URL") else "each server process's memory",
            **measured, "median_warm_ms": round(statistics.median(warm)),
            "uncached": uncached, "median_warm_uncached_ms": round(statistics.median(warm_uncached)), "target_ms": 2000}


def measure_compare(owner, ids: list[int], repeats: int, env: dict[str, str]) -> dict:
    from django.test import Client
    from playwright.sync_api import sync_playwright

    client = Client()
    client.force_login(owner)
    cookie = client.cookies["sessionid"].value
    chromium = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    navigations, last = [], {}
    with WebServer(env) as web, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tempfile.mkdtemp(prefix="scale-chromium-"), executable_path=shutil.which("chromium"), headless=True,
            args=chromium, viewport={"width": 1400, "height": 1000})
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": web.url}])
        page = context.new_page()
        url = f"{web.url}/dashboard/compare/?runs={','.join(map(str, ids))}"
        for _ in range(repeats):
            t = time.perf_counter()
            page.goto(url, wait_until="commit", timeout=300_000)  # the marker below is the end, not the load event
            page.wait_for_selector("body[data-compare-rendered='1']", timeout=300_000)
            navigations.append((time.perf_counter() - t) * 1000)
            last = page.evaluate("""({
                rendered_ms: Math.round(compareState.renderedMs),
                script_started_ms: Math.round(compareState.startedMs),
                webgl: !!document.createElement("canvas").getContext("webgl"),
                charts: compareState.charts.map(c => {
                    const series = performance.getEntriesByType("resource").filter(e => e.name.includes("/compare/series.")
                        && e.name.includes("key=" + encodeURIComponent(c.key))).pop();
                    return {key: c.key, runs_drawn: c.runsDrawn, points: c.runs.reduce((n, r) => n + r.x.length, 0),
                            traces: c.div.data.length, fetched_ms: Math.round(c.fetchedMs), built_ms: Math.round(c.builtMs),
                            drawn_ms: Math.round(c.drawnMs),
                            body_bytes: series && series.decodedBodySize,
                            request_start_ms: series && Math.round(series.requestStart),
                            request_to_response_ms: series && Math.round(series.responseStart - series.requestStart),
                            download_ms: series && Math.round(series.responseEnd - series.responseStart)};
                }),
            })""")
        context.close()
    return {"navigation_to_drawn_ms": [round(t) for t in navigations], "last_navigation": last}


class WebServer:
    """The platform's web server (webapp/server.py) on a free loopback port, on this cluster."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {})}

    def __enter__(self):
        from webapp import server

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log = tempfile.NamedTemporaryFile(prefix="scale-web-", suffix=".log", delete=False)
        self.process = subprocess.Popen(server.command("127.0.0.1", port, log_level="warning"), cwd=ROOT,
                                        stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the web server did not start: " + Path(self.log.name).read_text()[-2000:])
                time.sleep(0.2)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)
        Path(self.log.name).unlink(missing_ok=True)


BENCHES["compare"] = bench_compare


def headline(results: dict) -> dict:
    def pick(part, *path):
        value = results.get(part)
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    slowdown, rate = pick("slowdown", "median_slowdown_pct"), pick("slowdown", "steps_per_s_bare")
    return {
        # The best stored rate; details.worker says whether it was held without dropping points.
        "worker_path_points_per_s": pick("worker", "sustained_points_per_s") or pick("worker", "best_stored_points_per_s"),
        "training_slowdown_pct": slowdown if (rate or 0) >= 8 else None,
        **({} if (rate or 0) >= 8 or rate is None else {"training_slowdown_pct_reason": (
            f"the loop ran at {rate} steps/s here (not 10: the machine was loaded), and its paired slowdowns "
            f"ranged {pick('slowdown', 'range_pct')} %: noise far above a 2 % effect; see details.slowdown")}),
        "wal_bytes_per_point_4sps": pick("wal", "wal_bytes_per_point"),
        "run_page_10m_ms": pick("runpage", "run_page", "p99_ms"),
        "query_10m_p99_ms": pick("query", "all", "p99_ms"),
        "query_100m_p99_ms": pick("summaries", "all", "p99_ms"),
        "store_100m_seconds": pick("summaries", "store_s"),
        "viewers_5000_p99_ms": pick("viewers", "push", "p99_ms") if pick("viewers", "viewers") == 5000 else None,
        "new_connections_per_s": pick("viewers", "new_connections_per_s") if pick("viewers", "viewers") == 5000 else None,
        # Warm navigations (Plotly in the browser's cache and the series cache filled by the first navigation, as on
        # any visit after the first); the cold one, and those with the series cache off, are in details.compare.
        "compare_1000_runs_s": round(pick("compare", "median_warm_ms") / 1000, 2) if pick("compare", "median_warm_ms") else None,
    }


def main(parts: list[str]) -> None:
    unknown = set(parts) - set(BENCHES)
    if unknown:
        sys.exit(f"unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(BENCHES)}")
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    details = previous.get("details", {})
    with PrivatePostgres() as database:
        setup_django(database.url)
        for name in parts or list(BENCHES):
            load_before = os.getloadavg()[0]
            print(f"{name} ...", flush=True)
            try:
                details[name] = BENCHES[name]()
            except Exception as exc:  # noqa: BLE001 (recorded: the other parts still run)
                details[name] = {"error": f"{exc.__class__.__name__}: {exc}"}
            details[name]["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            print(json.dumps(details[name]), flush=True)
            write_results(previous, details)
    result = write_results(previous, details)
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))


def write_results(previous: dict, details: dict) -> dict:
    result = headline(details)  # parts not run this time keep their previous figures
    result.update({
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other work, {platform.system()} {platform.release()}",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "note": "each part on a private PostgreSQL cluster on this machine; load_average is the 1-minute average before/after each part",
        "details": details,
    })
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main([arg for arg in sys.argv[1:] if arg != "--part"])  # "--part summaries" or "summaries"
