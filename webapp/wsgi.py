import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
application = get_wsgi_application()

from webapp.warmup import warm_up  # noqa: E402

warm_up()  # before the first request, not during it
