"""The platform's web server: ``python -m webapp.server [--host H] [--port P] [--processes N]``.

uvicorn serving ``webapp.asgi`` (HTTP and the dashboard's websockets) on uvloop, httptools and
websockets' sans-I/O protocol. Every launcher (``manage.py platform``, the Docker image, the
browser tests, the benchmarks) starts the server through this module, so they all run what was
measured (docs/dashboard.md: it halved the 500-viewer push latency of daphne, the server before).

With several processes (``--processes``, default ``WEB_PROCESSES``) uvicorn binds the port once and
its worker processes accept from it in turn. They meet over the channel layer: each process holds
one subscription per watched run and serialises each event once for its own viewers (``RunHub``
in ``webapp.dashboard.consumers``), so a run's events cost Redis one message per process.
"""

from __future__ import annotations

import argparse
import os
import sys

from webapp.privileges import drop_root

# Hundreds of viewers may connect at once; the kernel's default listen queue would reset some.
BACKLOG = 1024
# Database connections each server process keeps open: Django's threads for HTTP requests plus the one
# thread that runs every websocket's database reads.
DATABASE_POOL_SIZE = 8
WORKER_HEALTHCHECK_SECONDS = 60


def command(host: str, port: int, log_level: str = "info", processes: int | None = None,
            warm_checker: bool = True) -> list[str]:
    """The argv that starts this server in a child process (``processes``: ``WEB_PROCESSES`` when None)."""
    argv = [sys.executable, "-m", "webapp.server", "--host", host, "--port", str(port), "--log-level", log_level]
    if processes is not None:
        argv += ["--processes", str(processes)]
    if not warm_checker:
        argv.append("--no-warm-checker")
    return argv


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m webapp.server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--processes", type=int, default=None,
                        help="server processes sharing the port (default: the WEB_PROCESSES setting)")
    parser.add_argument("--no-warm-checker", action="store_true",
                        help="do not start the run form's checking server at startup (benchmarks that never submit runs)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    # Each process keeps its database connections open in a pool (webapp.settings.DATABASE_POOL_SIZE):
    # opening one per request or websocket read was most of a websocket's connect time.
    os.environ.setdefault("DATABASE_POOL_SIZE", str(DATABASE_POOL_SIZE))
    from django.conf import settings

    drop_root(settings.VAR_DIR)
    processes = args.processes if args.processes is not None else settings.WEB_PROCESSES
    if processes < 1:
        parser.error(f"--processes must be at least 1, not {processes}")
    # Read by webapp.asgi.served_application() in each process, which uvicorn starts apart from this one.
    os.environ["PLATFORM_WARM_CHECKER"] = "0" if args.no_warm_checker else "1"
    uvicorn.run(
        "webapp.asgi:served_application", factory=True, host=args.host, port=args.port, workers=processes,
        log_level=args.log_level, backlog=BACKLOG, loop="uvloop", http="httptools", ws="websockets-sansio",
        # Channels' router has no ASGI lifespan handler; saying so keeps a startup warning away.
        lifespan="off",
        # uvicorn kills a process that leaves its health check unanswered this long, and with it
        # every viewer it holds; under a connection storm on a loaded machine 5 s (its default) is
        # not a hang (measured: 3 of 4 processes killed while 5,000 viewers opened).
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
    )


if __name__ == "__main__":
    main()
