"""``python -m workers.child <run id>``: the training process of one claimed run.

The Celery task supervises it (heartbeat, cancel, kill of the process group); see workers.execute.
It exits with ``EXIT_REQUEUED`` when it stopped (with a checkpoint) for a later attempt to resume.
"""

import os
import sys


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from webapp.runs.models import Run
    from workers.execute import EXIT_REQUEUED, train_run

    return EXIT_REQUEUED if train_run(int(sys.argv[1])) == Run.Status.QUEUED else 0


if __name__ == "__main__":
    sys.exit(main())
