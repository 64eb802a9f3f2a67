"""ASGI entry point (served by webapp/server.py): HTTP, and the dashboard's websockets (session-authenticated)."""

import os
import threading

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (after Django is set up)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

if settings.SERVE_STATIC:
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    django_application = ASGIStaticFilesHandler(django_application)

from webapp.dashboard.routing import websocket_urlpatterns  # noqa: E402
from webapp.policy.checks import warm_checker  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_application,
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})

from webapp.warmup import warm_up  # noqa: E402

warm_up()  # before the first request, not during it


def served_application():
    """The ASGI application as ``webapp.server`` serves it (uvicorn's ``factory``, called in each
    server process)."""
    if os.environ.get("PLATFORM_WARM_CHECKER", "1") == "1":
        # The run form's checks run in a jailed child of this process's warm checking server;
        # start it now, so the first person to submit a run does not wait for torch's import.
        threading.Thread(target=warm_checker, name="run-checker-warmup", daemon=True).start()
    return application
