"""How long a playground answer takes once a worker has taken it: the generating child process's
start, its imports, loading the run's weights and generating (``workers.playground.answer_request``,
the Celery task's body), for the built-in tiny model on the CPU. The wait for a free worker and the
broker's hop are not counted (they depend on what the queue's workers are doing). Each repeat asks
twice, the order alternating: the child started plain, and forked by a warm process as a worker
with ``RUN_WARM_PROCESS`` has (workers.processes.start_warm_process, started once before).

Everything lives in a temporary folder (an SQLite database, the run's folder), so the bench touches
no platform data.

    python bench/playground.py [--repeats 5] [--tokens 32]

Results: bench/results/playground.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-playground-")
    os.environ.update({"DATABASE_URL": f"sqlite:///{scratch}/bench.sqlite3", "PLATFORM_VAR_DIR": scratch,
                       "DJANGO_SETTINGS_MODULE": "webapp.settings"})
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from training.rollouts.tiny import save_tiny_model
    from webapp.playground.models import PlaygroundRequest
    from webapp.registry.models import Agent, Backend, Dataset
    from webapp.registry.seed import seed_registry
    from webapp.runs.models import Run
    from workers.playground import answer_request
    from workers.processes import WARM_PROCESS_ADDRESS, start_warm_process, stop_warm_process

    call_command("migrate", verbosity=0)
    seed_registry()
    user = get_user_model().objects.create_user("bench")
    run = Run.objects.create(owner=user, agent=Agent.objects.get(name="copy-task"), dataset=Dataset.objects.get(name="copy"),
                             backend=Backend.objects.get(name="trl"), model="tiny-char", status=Run.Status.SUCCEEDED)
    save_tiny_model(run.folder() / "final_model")
    Run.objects.filter(pk=run.pk).update(run_path=str(run.folder()))
    warm_process = start_warm_process()
    if warm_process is None:
        raise SystemExit("the warm process did not start")
    address = os.environ[WARM_PROCESS_ADDRESS]
    seconds = {"plain": [], "warm": []}
    for index in range(-1, args.repeats):  # -1: one answer, not counted, waits for the warm process's imports
        for kind in ("plain", "warm") if index % 2 == 0 else ("warm", "plain"):
            if index < 0 and kind == "plain":
                continue
            if kind == "plain":
                os.environ.pop(WARM_PROCESS_ADDRESS, None)
            else:
                os.environ[WARM_PROCESS_ADDRESS] = address
            asked = PlaygroundRequest.objects.create(
                run=run, user=user, model_name="final_model", messages=[{"role": "user", "content": "Hello, model."}],
                max_new_tokens=args.tokens, temperature=1.0, queue="cpu")
            started = time.perf_counter()
            status = answer_request(asked.pk, "bench")
            if index >= 0:
                seconds[kind].append(time.perf_counter() - started)
            asked.refresh_from_db()
            if status != "succeeded":
                raise SystemExit(f"the answer failed: {asked.error}")
    stop_warm_process(warm_process)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average": os.getloadavg()},
        "model": "tiny-char (built in code), CPU", "new_tokens": args.tokens, "repeats": args.repeats,
        "answer_seconds": {kind: [round(s, 2) for s in values] for kind, values in seconds.items()},
        "median_s": {kind: round(statistics.median(values), 2) for kind, values in seconds.items()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    path = ROOT / "bench" / "results" / "playground.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"answer after a worker took it: median {result['median_s']} s (plain, warm) of {args.repeats} "
          f"({args.tokens} new tokens; load average {result['machine']['load_average'][0]:.1f}); written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
