"""``python -m workers.playground_child <request id>``: generates the answer of one claimed
playground request (see workers.playground), then exits, freeing the model's memory."""

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()  # the modules below use the ORM at import

from workers.playground import generate_answer  # noqa: E402 (after Django's setup)


def main() -> int:
    generate_answer(int(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
