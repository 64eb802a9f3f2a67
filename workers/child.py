"""``python -m workers.child <run id>``: the training process of one claimed run.

The Celery task supervises it (heartbeat, cancel, kill of its session); see workers.execute.
It exits with ``EXIT_REQUEUED`` when it stopped (with a checkpoint) for a later attempt to resume.
With ``--episodes-drained`` it only spools the episode store's records: its supervisor stores them.
A worker with a warm process forks it from there, its libraries already imported (workers.processes).
"""

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()  # the modules below use the ORM at import

from webapp.runs.models import Run  # noqa: E402 (after Django's setup, as every import below)
from workers.database import bound_idle_transactions  # noqa: E402
from workers.execute import DRAINED, EXIT_REQUEUED, train_run  # noqa: E402
from workers.processes import kill_own_session  # noqa: E402


def main() -> int:
    bound_idle_transactions()
    drained = DRAINED in sys.argv
    run_id = int(next(arg for arg in sys.argv[1:] if arg != DRAINED))
    status = train_run(run_id, on_lost=kill_own_session, episodes_drained=drained)
    return EXIT_REQUEUED if status == Run.Status.QUEUED else 0


if __name__ == "__main__":
    sys.exit(main())
