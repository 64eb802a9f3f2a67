"""Episode store benchmarks. Results: bench/results/episodes.json.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/episodes_bench python bench/episodes.py [listing detail training histogram large_steps]

1. listing   ``GET /api/runs/<id>/episodes/`` (the API view through Django's test client) over a run of
             LISTING_EPISODES synthetic episodes, among OTHER_RUNS x OTHER_EPISODES more of other runs,
             inserted in bulk by PostgreSQL itself (generate_series); p50/p99 of each filter (and of a
             page a next link leads to, deep in the run), after one warm-up request each
2. detail    ``GET /api/runs/<id>/episodes/<id>/`` of random episodes of DETAIL_STEPS steps x
             DETAIL_PER_STEP episodes of DETAIL_TOKENS tokens each, written by the real writer
             (Parquet in a local artifact store); p50/p99
3. training  the tiny model trained on the CPU in a training process of its own, through the
             platform's sink as a worker's training process uses it (episodes spooled, stored by the
             supervising process: this one), with the store on and off in pairs (same seed, order
             alternated): the ratio of their ``train()`` times, the time the training thread spent
             handing records to the sinks, the supervisor's time storing them (Parquet and index rows,
             wall) and its drain's CPU (the thread's CPU over every flush: segments read, stored and
             deleted; on a shared machine the steadier figure)
4. histogram one step's reward histogram, ``GET /api/runs/<id>/episodes/histogram/?step=`` (20 bins), over
             the listing's stored set (its run of LISTING_EPISODES among the others); p50/p99, and the
             listing a bar opens (that step, the bar's reward range)
5. library   the library alone (no platform): the tiny model trained in a process of its own with the
             run folder's episode store (``ParquetEpisodeSink``) on and off in pairs, as ``training``;
             ``train()`` timed with its end (every step's Parquet file written) included
6. growth    PostgreSQL's growth per stored episode: GROWTH_STEPS steps stored by the real writer
             (``store_step``: Parquet in a local artifact store, then the index rows), of long
             episodes (the detail's) and of short ones (the training bench's size), copied into a
             table made like the episodes' table with all its indexes (``LIKE ... INCLUDING ALL``),
             whose whole size (heap, TOAST, every index) is divided by its rows; and the Parquet
             bytes per episode in the artifact store
7. large_steps  the training thread's cost of one large step (64 episodes x 1,024 tokens):
             ``DashboardSink.store_episodes`` (buffered and spooled to disk), and the writer's flush of it (wall, CPU)

The database named by DATABASE_URL is created if missing and migrated; its runs are deleted first.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchdb import migrated_postgres  # noqa: E402  (bench/ is the script's folder)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
RESULTS = ROOT / "bench" / "results" / "episodes.json"

LISTING_EPISODES = 1_000_000  # 10,000 steps x 100 episodes
OTHER_RUNS, OTHER_EPISODES = 4, 250_000
LISTING_REQUESTS = 200
DETAIL_STEPS, DETAIL_PER_STEP, DETAIL_TOKENS = 20, 64, 1024
DETAIL_REQUESTS = 200
TRAINING_PAIRS = int(os.environ.get("BENCH_TRAINING_PAIRS", "12"))  # more pairs, a narrower interval


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(1000 * statistics.median(ordered), 2),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2), "n": len(ordered)}


def bench_user():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": False})
    return user


def new_run(user, tmp: Path):
    from webapp.registry.models import Agent, Backend, Dataset, RewardFunction
    from webapp.runs.models import Run

    run = Run.objects.create(owner=user, agent=Agent.objects.get(name="copy-task"), dataset=Dataset.objects.get(name="copy"),
                             reward=RewardFunction.objects.get(name="char-accuracy"), backend=Backend.objects.get(name="trl"),
                             model="tiny-char")
    run.run_path = str(tmp / f"{run.pk}-{run.uid.hex}")
    run.save(update_fields=["run_path"])
    return run


def insert_synthetic(run_id: int, count: int, per_step: int = 100) -> None:
    """``count`` index rows of ``run_id`` made by PostgreSQL (their bodies are not read here)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("""
            insert into dashboard_storedepisode (run_id, split, step, position, attempt, "group", group_position,
                data_source, row_index, reward, advantage, is_correct, termination_reason, num_turns, prompt_length,
                response_length, error, text, body_key, body_row)
            select %s, 'train', i / %s + 1, i %% %s, 1, md5(((i / 8) + %s)::text), i %% 8,
                (array['math', 'code', 'copy', 'search'])[1 + (i / 8) %% 4], i %% 5000, round(random()::numeric, 3),
                random() - 0.5, random() < 0.3,
                (array['env_done', 'env_done', 'env_done', 'max_turns', 'max_response_length', 'timeout', 'error'])[1 + i %% 7],
                1 + i %% 5, 100 + i %% 50, 200 + i %% 300, '',
                'task ' || i || ' solve ' || md5(i::text) || ' answer ' || (i %% 997),
                'episodes/train/step-' || (i / %s + 1) || '.parquet', i %% %s
            from generate_series(0, %s - 1) as i
        """, [run_id, per_step, per_step, run_id * 10_000_000, per_step, per_step, count])
        cursor.execute("analyze dashboard_storedepisode")


def settle() -> None:
    """VACUUM the table, as autovacuum does a while after a bulk load (or the runs the bench deleted
    first): without it the first read of each page sets its rows' hint bits and prunes the deleted
    ones, and a query's time is mostly those writes (a random step range then took 100-300 ms, the
    same range read again 11 ms)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("vacuum analyze dashboard_storedepisode")


def bench_listing(user, tmp: Path) -> dict:
    from rest_framework.test import APIClient

    run = new_run(user, tmp)
    started = time.perf_counter()
    insert_synthetic(run.pk, LISTING_EPISODES)
    for _ in range(OTHER_RUNS):
        insert_synthetic(new_run(user, tmp).pk, OTHER_EPISODES)
    inserted = time.perf_counter() - started
    settle()
    client = APIClient()
    client.force_authenticate(user)
    rng = random.Random(0)
    steps = LISTING_EPISODES // 100
    cases = {
        "no filter": lambda: {},
        "step range": lambda: {"step_min": (s := rng.randrange(steps)), "step_max": s + 10},
        "reward range": lambda: {"reward_min": (r := round(rng.random(), 2)), "reward_max": r + 0.05},
        "termination": lambda: {"termination": rng.choice(["timeout", "error", "max_turns"])},
        "data source + steps": lambda: {"data_source": rng.choice(["math", "code"]), "step_min": (s := rng.randrange(steps)), "step_max": s + 100},
        "group": lambda: {"group": __import__("hashlib").md5(str(rng.randrange(LISTING_EPISODES // 8) + run.pk * 10_000_000).encode()).hexdigest()},
        "reward + termination, deep page": lambda: {"reward_min": 0.9, "termination": "error", "offset": 2000},
        # Where a page's next link leads, anywhere in the run (its cursor: after a step's 50th episode).
        "no filter, a next page deep in the run": lambda: {"cursor": f"{rng.randrange(1, steps + 1)}:train:49"},
        "text (q) in a step range": lambda: {"q": f"answer {rng.randrange(997)}", "step_min": (s := rng.randrange(steps)), "step_max": s + 100},
        "text (q) over the whole run": lambda: {"q": f"solve {rng.randrange(10**6):x}"},
    }
    results = {}
    for name, params in cases.items():
        client.get(f"/api/runs/{run.pk}/episodes/", {"limit": 50, **params()})  # warm-up: the first request's imports
        times, sizes = [], []
        for _ in range(LISTING_REQUESTS if "whole run" not in name else 20):
            query = {"limit": 50, **params()}
            began = time.perf_counter()
            response = client.get(f"/api/runs/{run.pk}/episodes/", query)
            times.append(time.perf_counter() - began)
            assert response.status_code == 200, response.content
            sizes.append(len(response.json()["results"]))
        results[name] = {**percentiles(times), "mean_results": round(statistics.mean(sizes), 1),
                         "load_average_after": round(os.getloadavg()[0], 1)}
        print(f"listing {name}: {results[name]}", flush=True)
    return {"episodes_in_run": LISTING_EPISODES, "episodes_in_table": LISTING_EPISODES + OTHER_RUNS * OTHER_EPISODES,
            "page_size": 50, "insert_seconds": round(inserted, 1), "cases": results}


def bench_histogram(user, tmp: Path) -> dict:
    run = new_run(user, tmp)
    insert_synthetic(run.pk, LISTING_EPISODES)
    for _ in range(OTHER_RUNS):
        insert_synthetic(new_run(user, tmp).pk, OTHER_EPISODES)
    settle()
    return measure_histogram(user, run)


def measure_histogram(user, run) -> dict:
    """Over ``run``'s LISTING_EPISODES stored episodes, interleaved so they share the machine's load:
    one step's histogram through the API view, ``reward_histogram`` alone (the database's part), the
    listing of one whole step (the plainest listing, a baseline), and the listing a bar opens."""
    from rest_framework.test import APIClient

    from webapp.dashboard.episodes import reward_histogram

    client = APIClient()
    client.force_authenticate(user)
    rng = random.Random(2)
    steps = LISTING_EPISODES // 100
    times: dict[str, list[float]] = {"histogram": [], "reward_histogram alone": [], "listing of one step": [],
                                     "bar opened": []}
    counts = []

    def timed(name, call):
        began = time.perf_counter()
        value = call()
        times[name].append(time.perf_counter() - began)
        return value

    client.get(f"/api/runs/{run.pk}/episodes/histogram/", {"bins": 20})  # warm-up: the first request's imports
    for _ in range(LISTING_REQUESTS):
        step = rng.randrange(1, steps + 1)
        response = timed("histogram", lambda: client.get(f"/api/runs/{run.pk}/episodes/histogram/", {"step": step, "bins": 20}))
        assert response.status_code == 200 and response.json()["count"] == 100, response.content
        timed("reward_histogram alone", lambda: reward_histogram(run, "train", step, 20))
        timed("listing of one step", lambda: client.get(f"/api/runs/{run.pk}/episodes/", {"step_min": step, "step_max": step}))
        bar = rng.choice([b for b in response.json()["bins"] if b["count"]])
        listed = timed("bar opened", lambda: client.get(f"/api/runs/{run.pk}/episodes/", {
            "split": "train", "step_min": step, "step_max": step, "reward_min": bar["reward_min"], "reward_max": bar["reward_max"]}))
        assert len(listed.json()["results"]) == bar["count"]
        counts.append(bar["count"])
    result = {"episodes_in_run": LISTING_EPISODES, "episodes_per_step": 100, "bins": 20,
              **{name: percentiles(samples) for name, samples in times.items()},
              "bar_mean_results": round(statistics.mean(counts), 1), "load_average_after": round(os.getloadavg()[0], 1)}
    print(f"histogram: {result}", flush=True)
    return result


def bench_detail(user, tmp: Path) -> dict:
    from rest_framework.test import APIClient

    from webapp.dashboard.episodes import store_step
    from webapp.dashboard.models import StoredEpisode

    run = new_run(user, tmp)
    rng = random.Random(1)
    started = time.perf_counter()
    for step in range(1, DETAIL_STEPS + 1):
        records = detail_records(rng, step)
        store_step(run.pk, 1, step, records)
    written = time.perf_counter() - started
    client = APIClient()
    client.force_authenticate(user)
    ids = list(StoredEpisode.objects.filter(run=run).values_list("id", flat=True))
    client.get(f"/api/runs/{run.pk}/episodes/{ids[0]}/")  # warm-up: the first request's imports
    times = []
    for _ in range(DETAIL_REQUESTS):
        episode_id = rng.choice(ids)
        began = time.perf_counter()
        response = client.get(f"/api/runs/{run.pk}/episodes/{episode_id}/")
        times.append(time.perf_counter() - began)
        assert response.status_code == 200 and len(response.json()["token_ids"]) == DETAIL_TOKENS
    began = time.perf_counter()
    exported = b"".join(client.get(f"/api/runs/{run.pk}/episodes/", {"format": "parquet", "step_max": 5}).streaming_content)
    export_seconds = time.perf_counter() - began
    result = {"episodes": len(ids), "tokens_per_episode": DETAIL_TOKENS, "turns_per_episode": 4,
              "write_seconds_per_step": round(written / DETAIL_STEPS, 3), **percentiles(times),
              "load_average_after": round(os.getloadavg()[0], 1),
              "parquet_export_5_steps": {"episodes": 5 * DETAIL_PER_STEP, "seconds": round(export_seconds, 2),
                                         "bytes": len(exported)}}
    print(f"detail: {result}", flush=True)
    return result


TRAINING_CONFIG = {"actor_rollout_ref.model.path": "tiny-char", "actor_rollout_ref.rollout.n": 8, "data.train_batch_size": 4,
                   "data.max_response_length": 16, "trainer.total_training_steps": 15, "trainer.logger": [],
                   "trainer.system_metrics_interval": 0, "trainer.test_freq": -1, "trainer.val_before_train": False}


def training_process(runs_dir: str) -> None:
    """``python bench/episodes.py --training-process <runs dir>``: the platform's training process,
    alone: for each line ``<run id> <run folder> <0|1>`` on stdin it trains the tiny model through
    the platform's sink as ``workers.child --episodes-drained`` does (episodes spooled, stored by the
    supervising process: the bench's), with the episode store on (1) or off (0), and prints the
    seconds ``train()`` took and those the training thread spent handing records to the sinks."""
    import django

    django.setup()
    import torch
    from django.conf import settings

    from training import AgentTrainer
    from training.tracking.sinks import MultiSink
    from webapp.dashboard.recording import DashboardSink, EpisodeHandoff

    settings.RUNS_DIR, settings.ARTIFACTS_URL = Path(runs_dir), ""
    torch.set_num_threads(1)
    prompts = [{"prompt": f"{a}{b}{c}=", "data_source": "copy"} for a in "abc" for b in "abc" for c in "abc"]

    def reward(task, response):
        return float(response[:3] == task["prompt"][:3])

    in_thread = {"seconds": 0.0}
    handed = MultiSink.store_episodes

    def timed(self, step, records):  # the training thread's share: handing a step's records to the sinks
        began = time.perf_counter()
        handed(self, step, records)
        in_thread["seconds"] += time.perf_counter() - began

    MultiSink.store_episodes = timed
    waited = {"seconds": 0.0}
    close = EpisodeHandoff.close

    def timed_close(self):  # the run's end waiting for the supervisor to store the last steps
        began = time.perf_counter()
        close(self)
        waited["seconds"] += time.perf_counter() - began

    EpisodeHandoff.close = timed_close
    for line in sys.stdin:
        run_id, run_path, store_on = line.split()
        in_thread["seconds"] = waited["seconds"] = 0.0
        sink = DashboardSink(int(run_id), publish=False, spool_dir=run_path, episodes_drained=True)
        trainer = AgentTrainer(train_dataset=prompts, reward_func=reward, backend="trl", run_path=run_path,
                               config={**TRAINING_CONFIG, "trainer.log_episodes": store_on == "1"}, sinks=[sink])
        began = time.perf_counter()
        trainer.train()  # its end included: the sinks closed, the episodes stored
        print(json.dumps({"seconds": time.perf_counter() - began, "handing": in_thread["seconds"],
                          "end_wait": waited["seconds"]}), flush=True)


def library_process() -> None:
    """``python bench/episodes.py --library-process``: the library alone, no platform: for each line
    ``<run folder> <0|1>`` on stdin it trains the tiny model with the episode store on (1: the run
    folder's ``ParquetEpisodeSink``) or off (0), and prints the seconds ``train()`` took and the
    number of episodes the run folder then holds."""
    import torch

    from training import AgentTrainer
    from training.tracking.episodes import read_run_folder

    torch.set_num_threads(1)
    prompts = [{"prompt": f"{a}{b}{c}=", "data_source": "copy"} for a in "abc" for b in "abc" for c in "abc"]

    def reward(task, response):
        return float(response[:3] == task["prompt"][:3])

    for line in sys.stdin:
        run_path, store_on = line.split()
        trainer = AgentTrainer(train_dataset=prompts, reward_func=reward, backend="trl", run_path=run_path,
                               config={**TRAINING_CONFIG, "trainer.log_episodes": store_on == "1"})
        began = time.perf_counter()
        trainer.train()  # its end included: the sinks closed, every step's Parquet file written
        seconds = time.perf_counter() - began
        print(json.dumps({"seconds": seconds, "stored": len(read_run_folder(run_path))}), flush=True)


def paired_summary(pairs: list[dict]) -> dict:
    """The paired on/off runs' ratios: the median pair's with its bootstrap interval, and the ratio of
    the summed times with its own (pairs resampled with replacement)."""
    ratios = [p["ratio"] for p in pairs]
    rng = random.Random(0)
    totals = []
    for _ in range(10_000):
        chosen = rng.choices(pairs, k=len(pairs))
        totals.append(sum(p["on_s"] for p in chosen) / sum(p["off_s"] for p in chosen))
    totals.sort()
    return {"median_ratio_on_over_off": round(statistics.median(ratios), 3),
            "median_ratio_95_interval": median_interval(ratios),
            "total_ratio_on_over_off": round(sum(p["on_s"] for p in pairs) / sum(p["off_s"] for p in pairs), 3),
            "total_ratio_95_bootstrap_interval": [round(totals[250], 3), round(totals[9749], 3)],
            "min_max_ratio": [min(ratios), max(ratios)],
            "median_on_s": round(statistics.median(p["on_s"] for p in pairs), 3),
            "median_off_s": round(statistics.median(p["off_s"] for p in pairs), 3)}


def bench_library(user, tmp: Path) -> dict:
    """The library alone: ``library_process`` trains with the run folder's store on and off, in
    alternating pairs."""
    import subprocess

    child = subprocess.Popen([sys.executable, __file__, "--library-process"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ))

    def once(store_on: bool) -> float:
        folder = Path(tempfile.mkdtemp(prefix="run-", dir=tmp))
        child.stdin.write(f"{folder} {int(store_on)}\n")
        child.stdin.flush()
        answer = child.stdout.readline()
        if not answer:
            sys.exit(f"the training process ended (exit code {child.wait()})")
        result = json.loads(answer)
        assert result["stored"] == (15 * 32 if store_on else 0), result
        return result["seconds"]

    once(True)  # warm-up: imports, the tiny model's first build
    pairs = []
    for index in range(TRAINING_PAIRS):
        order = (True, False) if index % 2 == 0 else (False, True)
        seconds = {mode: once(mode) for mode in order}
        pairs.append({"on_s": round(seconds[True], 3), "off_s": round(seconds[False], 3),
                      "ratio": round(seconds[True] / seconds[False], 3)})
        print(f"library pair {index}: {pairs[-1]}", flush=True)
    child.stdin.close()
    child.wait()
    return {"steps": 15, "episodes_per_step": 32, "response_tokens_max": 16, "pairs": pairs, **paired_summary(pairs),
            "load_average_after": round(os.getloadavg()[0], 1),
            "note": ("the library alone: the run folder's store (ParquetEpisodeSink) on vs off, the same training "
                     "process for every run; CPU, 1 torch thread; train() timed, its end (every step's Parquet "
                     "file written) included")}


def bench_training(user, tmp: Path) -> dict:
    """The production path: a training process of its own (``training_process``) spools the
    episodes, and this process, as the worker supervising it, stores them (``EpisodeDrain``, also
    running, with nothing to store, when the store is off)."""
    import subprocess

    from webapp.dashboard import episodes as episodes_module
    from webapp.dashboard.models import StoredEpisode
    from webapp.dashboard.recording import EpisodeDrain

    stored = {"seconds": 0.0}
    writes = {name: getattr(episodes_module, name) for name in ("put_step_bodies", "index_step_bodies")}

    def timed_write(write):  # the supervisor's share: a step's Parquet file, then its index rows
        def timed(*args, **kwargs):
            began = time.perf_counter()
            result = write(*args, **kwargs)
            stored["seconds"] += time.perf_counter() - began
            return result
        return timed

    for name, write in writes.items():
        setattr(episodes_module, name, timed_write(write))
    drain_cpu = {"seconds": 0.0}
    flush = EpisodeDrain.flush

    def timed_flush(self):  # the drain's whole CPU (its thread's, or close's): segments read, stored, deleted
        began = time.thread_time()
        try:
            return flush(self)
        finally:
            drain_cpu["seconds"] += time.thread_time() - began

    EpisodeDrain.flush = timed_flush
    child = subprocess.Popen([sys.executable, __file__, "--training-process", str(tmp)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ))

    def once(store_on: bool) -> dict:
        run = new_run(user, tmp)
        drain = EpisodeDrain(run.pk, run.run_path, attempt=None)
        child.stdin.write(f"{run.pk} {run.run_path} {int(store_on)}\n")
        child.stdin.flush()
        answer = child.stdout.readline()
        if not answer:
            sys.exit(f"the training process ended (exit code {child.wait()})")
        drain.close()
        count = StoredEpisode.objects.filter(run=run).count()
        assert count == (15 * 32 if store_on else 0), count
        return json.loads(answer)

    once(True)  # warm-up: imports, the tiny model's first build
    pairs = []
    for index in range(TRAINING_PAIRS):
        order = (True, False) if index % 2 == 0 else (False, True)
        stored["seconds"] = 0.0
        cpu = {}
        seconds = {}
        for mode in order:
            drain_cpu["seconds"] = 0.0
            seconds[mode] = once(mode)
            cpu[mode] = drain_cpu["seconds"]
        pairs.append({"on_s": round(seconds[True]["seconds"], 3), "off_s": round(seconds[False]["seconds"], 3),
                      "ratio": round(seconds[True]["seconds"] / seconds[False]["seconds"], 3),
                      "handing_records_to_sinks_s": round(seconds[True]["handing"], 3),
                      "end_waiting_for_the_store_s": round(seconds[True]["end_wait"], 3),
                      "supervisor_storing_episodes_s": round(stored["seconds"], 3),
                      "supervisor_drain_cpu_s": round(cpu[True], 3), "supervisor_drain_cpu_store_off_s": round(cpu[False], 3)})
        print(f"training pair {index}: {pairs[-1]}", flush=True)
    child.stdin.close()
    child.wait()
    for name, write in writes.items():
        setattr(episodes_module, name, write)
    EpisodeDrain.flush = flush
    ratios = [p["ratio"] for p in pairs]
    return {"steps": 15, "episodes_per_step": 32, "response_tokens_max": 16, "pairs": pairs,
            "median_ratio_on_over_off": round(statistics.median(ratios), 3),
            "median_ratio_95_interval": median_interval(ratios),
            "min_max_ratio": [min(ratios), max(ratios)],
            "median_supervisor_drain_cpu_s": round(statistics.median(p["supervisor_drain_cpu_s"] for p in pairs), 3),
            "load_average_after": round(os.getloadavg()[0], 1),
            "note": ("the platform's path: the training process (its own, as a worker's) spools every episode and its "
                     "supervising process (this one) stores them (Parquet + index rows); off: the store off, the "
                     "supervisor's drain running all the same; CPU, 1 torch thread; train() timed in the training "
                     "process, its end (the sinks closed, every episode stored) included")}


def median_interval(ratios: list[float], resamples: int = 10_000, seed: int = 0) -> list[float]:
    """A 95 % bootstrap interval of the median of the paired ratios (pairs resampled with replacement)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return [round(medians[int(0.025 * resamples)], 3), round(medians[int(0.975 * resamples) - 1], 3)]


def bench_store_call(user, tmp: Path) -> dict:
    """The training thread's cost of one large step: ``DashboardSink.store_episodes`` (buffer and
    spool to disk) of 64 episodes of 1,024 response tokens, and the writer's store of it."""
    from webapp.dashboard.recording import DashboardSink

    run = new_run(user, tmp)
    records = detail_records(random.Random(2), step=1)
    sink = DashboardSink(run.pk, flush_seconds=3600, publish=False, spool_dir=run.run_path)
    calls, writes, writes_cpu = [], [], []
    for step in range(1, 21):
        step_records = [dict(r, step=step) for r in records]
        began = time.perf_counter()
        sink.store_episodes(step, step_records)
        calls.append(time.perf_counter() - began)
        began, began_cpu = time.perf_counter(), time.thread_time()
        sink.episode_writer.flush()
        writes.append(time.perf_counter() - began)
        writes_cpu.append(time.thread_time() - began_cpu)
    sink.close()
    return {"episodes_per_step": len(records), "tokens_per_episode": DETAIL_TOKENS,
            "store_episodes_call (training thread)": percentiles(calls), "writer_flush (writer thread)": percentiles(writes),
            "writer_flush_cpu (its thread's CPU)": percentiles(writes_cpu), "load_average_after": round(os.getloadavg()[0], 1)}


GROWTH_STEPS = 20


def bench_growth(user, tmp: Path) -> dict:
    from django.db import connection

    from webapp.dashboard.episodes import store_step
    from webapp.dashboard.models import StoredEpisode

    table = StoredEpisode._meta.db_table
    result = {}
    for kind, make in (("long: 4 turns, 1,024 response tokens (the detail's)", detail_records),
                       ("short: 1 turn, 16 response tokens (the training bench's)", short_records)):
        run = new_run(user, tmp)
        rng = random.Random(3)
        for step in range(1, GROWTH_STEPS + 1):
            store_step(run.pk, 1, step, make(rng, step))
        parquet = sum(path.stat().st_size for path in Path(run.run_path).rglob("*.parquet"))
        with connection.cursor() as cursor:
            cursor.execute(f'create temporary table growth_probe (like "{table}" including all)')
            cursor.execute(f'insert into growth_probe select * from "{table}" where run_id = %s', [run.pk])
            cursor.execute("select count(*), pg_total_relation_size('growth_probe'), pg_relation_size('growth_probe'), "
                           "pg_indexes_size('growth_probe') from growth_probe")
            rows, total, heap, indexes = cursor.fetchone()
            cursor.execute("drop table growth_probe")
        if not parquet:  # an artifact store elsewhere than the run folder: read back its size there
            parquet = None
        result[kind] = {"episodes": rows, "postgres_bytes_per_episode": round(total / rows),
                        "heap_bytes_per_episode": round(heap / rows), "index_bytes_per_episode": round(indexes / rows),
                        "parquet_bytes_per_episode": None if parquet is None else round(parquet / rows)}
        print(f"growth {kind}: {result[kind]}", flush=True)
    result["note"] = ("the run's index rows copied into a table made like the episodes' table with every index "
                      "(LIKE ... INCLUDING ALL), its whole size (heap, TOAST, indexes, the trigram index of the "
                      "conversation's first 2,000 characters among them) over its rows; rows inserted one step at a "
                      "time by the writer fill their pages about as a bulk copy does. The bodies (tokens, masks, "
                      "log-probabilities, turns) are in Parquet in the artifact store, not in PostgreSQL")
    return result


def short_records(rng: random.Random, step: int) -> list[dict]:
    from training.tracking.episodes import episode_record
    from training.types import Episode, Step, TerminationReason, Trajectory

    records = []
    for position in range(32):
        tokens = [rng.randrange(64) for _ in range(16)]
        turn = Step(chat_completions=[{"role": "user", "content": "abc="}], model_response="abc" + "x" * 13, reward=1.0, done=True)
        episode = Episode(task={"data_source": "copy"}, trajectories=[Trajectory(steps=[turn], reward=rng.random())],
                          prompt_ids=tokens[:4], response_ids=tokens, response_mask=[1] * 16,
                          response_logprobs=[-rng.random() for _ in tokens], termination_reason=TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED)
        records.append(episode_record(episode, split="train", step=step, position=position, group=f"g{position // 8}",
                                      group_position=position % 8, advantage=0.1))
    return records


def detail_records(rng: random.Random, step: int) -> list[dict]:
    from training.tracking.episodes import episode_record
    from training.types import Episode, Step, TerminationReason, Trajectory

    records = []
    for position in range(DETAIL_PER_STEP):
        tokens = [rng.randrange(32000) for _ in range(DETAIL_TOKENS)]
        turns = [Step(chat_completions=[{"role": "user", "content": f"turn {t} " + "x" * 200}], model_response="y" * 300,
                      reward=0.0, done=t == 3) for t in range(4)]
        episode = Episode(task={"data_source": "math"}, trajectories=[Trajectory(steps=turns, reward=rng.random())],
                          prompt_ids=tokens[:128], response_ids=tokens, response_mask=[rng.randrange(2) for _ in tokens],
                          response_logprobs=[-rng.random() for _ in tokens], termination_reason=TerminationReason.ENV_DONE)
        records.append(episode_record(episode, split="train", step=step, position=position, group=f"g{position // 8}",
                                      group_position=position % 8, advantage=0.1))
    return records


def main() -> None:
    if sys.argv[1:2] == ["--training-process"]:
        return training_process(sys.argv[2])
    if sys.argv[1:2] == ["--library-process"]:
        return library_process()
    wanted = sys.argv[1:] or ["listing", "detail", "training", "large_steps"]
    migrated_postgres()
    from django.conf import settings

    tmp = Path(tempfile.mkdtemp(prefix="episodes-bench-"))
    settings.RUNS_DIR = tmp
    settings.ARTIFACTS_URL = ""
    settings.ALLOWED_HOSTS = ["testserver"]
    user = bench_user()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in wanted:
        # Each section says the machine and day it was measured on (sections are rerun one at a time).
        machine = f"{os.cpu_count()} CPUs, load average before {os.getloadavg()[0]:.1f}"
        results[name] = {"listing": bench_listing, "detail": bench_detail, "training": bench_training, "library": bench_library, "growth": bench_growth,
                         "histogram": bench_histogram, "large_steps": bench_store_call}[name](user, tmp)
        results[name].update(machine=machine, date=time.strftime("%Y-%m-%d"))
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results in {RESULTS}")


if __name__ == "__main__":
    main()
