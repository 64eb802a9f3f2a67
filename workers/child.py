"""``python -m workers.child <run id>``: the training process of one claimed run.

The Celery task supervises it (heartbeat, cancel, kill of its session); see workers.execute.
It exits with ``EXIT_REQUEUED`` when it stopped (with a checkpoint) for a later attempt to resume.
With ``--episodes-drained`` it only spools the episode store's records: its supervisor stores them.

``python -m workers.child --wait``: a spare one. It imports the training libraries first, then
reads ``<run id> <output file>`` from its stdin (end of input: the worker is gone, it exits),
sends its output to that file and trains the run.
"""

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()  # the modules below use the ORM at import

from django.db import connections  # noqa: E402 (after Django's setup, as every import below)

from webapp.runs.models import Run  # noqa: E402
from workers.database import bound_idle_transactions  # noqa: E402
from workers.execute import DRAINED, EXIT_REQUEUED, train_run  # noqa: E402
from workers.processes import kill_own_session  # noqa: E402


def main() -> int:
    bound_idle_transactions()
    drained = DRAINED in sys.argv
    args = [arg for arg in sys.argv[1:] if arg != DRAINED]
    if args[0] == "--wait":
        from trl import GRPOTrainer  # noqa: F401 (what takes a new training process seconds: torch, transformers, TRL)

        connections.close_all()  # it may wait for hours: no connection held meanwhile
        line = sys.stdin.readline().split(maxsplit=1)
        if len(line) != 2:
            return 0
        run_id, output = int(line[0]), line[1].strip()
        fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    else:
        run_id = int(args[0])
    status = train_run(run_id, on_lost=kill_own_session, episodes_drained=drained)
    return EXIT_REQUEUED if status == Run.Status.QUEUED else 0


if __name__ == "__main__":
    sys.exit(main())
