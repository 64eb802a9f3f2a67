"""``python -m workers.evaluation_child <evaluation id>``: scores one claimed evaluation of a
checkpoint (see workers.evaluation), then exits, freeing the model's memory."""

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()  # the modules below use the ORM at import

from workers.evaluation import score_checkpoint  # noqa: E402 (after Django's setup)


def main() -> int:
    score_checkpoint(int(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
