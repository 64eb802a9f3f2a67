"""``python -m workers.playground_child <request id>``: generates the answer of one claimed
playground request (see workers.playground), then exits, freeing the model's memory."""

import os
import sys


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from workers.playground import generate_answer

    generate_answer(int(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
