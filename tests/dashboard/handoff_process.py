"""A training process's episode store side, alone: ``python tests/dashboard/handoff_process.py
<run id> <run folder> <attempt> <runs dir> <steps> <end>``. It spools ``steps`` steps of 4 episodes
through the real ``DashboardSink`` handing them off (``episodes_drained``), as ``workers.child
--episodes-drained`` does, then ends as ``end`` says: ``close`` (the sink closed, as at a run's
end), ``kill`` (SIGKILL, as the OOM killer), or ``close-after:<file>`` (closed once the file exists).
It prints ``spooled`` when the steps are spooled."""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())  # the repository (the tests start it from there)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for the records
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from episode_records import synthetic  # noqa: E402
from webapp.dashboard.recording import DashboardSink  # noqa: E402


def main() -> None:
    run_id, folder, attempt, runs_dir, steps, end = sys.argv[1:7]
    settings.RUNS_DIR = Path(runs_dir)
    sink = DashboardSink(int(run_id), flush_seconds=0.2, publish=False, spool_dir=folder, attempt=int(attempt),
                         episodes_drained=True)
    for step in range(1, int(steps) + 1):
        sink.store_episodes(step, [synthetic(step, p, step / 4) for p in range(4)])
    print("spooled", flush=True)
    if end == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if end.startswith("close-after:"):
        while not Path(end.split(":", 1)[1]).exists():
            time.sleep(0.05)
    sink.close()


if __name__ == "__main__":
    main()
