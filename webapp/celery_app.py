"""The Celery app the web side uses to see its workers (health check, the workers page), configured
from Django's settings (``CELERY_*``). It sends no work: queued runs are sent by the workers'
dispatcher (``workers.housekeeping``), and the workers add their tasks to this app
(``workers.celery_app``). The web side never imports ``workers``: data flows one way.
"""

from celery import Celery

app = Celery("workers")
app.config_from_object("django.conf:settings", namespace="CELERY")
