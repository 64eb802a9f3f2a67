"""``python -m workers.child <run id>``: the training process of one claimed run.

The Celery task supervises it (heartbeat, cancel, kill of the process group); see workers.execute.
"""

import os
import sys


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from workers.execute import train_run

    train_run(int(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
