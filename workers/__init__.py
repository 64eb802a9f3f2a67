"""The bridge between the web platform and the training library: Celery tasks that execute runs.

Start a worker with ``celery -A workers worker -Q cpu`` (see docs/platform.md).
"""

from workers.celery_app import app

__all__ = ["app"]
