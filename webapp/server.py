"""The platform's web server: ``python -m webapp.server [--host H] [--port P]``.

uvicorn serving ``webapp.asgi`` (HTTP and the dashboard's websockets) on uvloop, httptools and
websockets' sans-I/O protocol. Every launcher (``manage.py platform``, the Docker image, the
browser tests, the benchmarks) starts the server through this module, so they all run what was
measured (docs/dashboard.md: it halved the 500-viewer push latency of daphne, the server before).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

# Hundreds of viewers may connect at once; the kernel's default listen queue would reset some.
BACKLOG = 1024


def command(host: str, port: int, log_level: str = "info") -> list[str]:
    """The argv that starts this server in a child process."""
    return [sys.executable, "-m", "webapp.server", "--host", host, "--port", str(port), "--log-level", log_level]


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m webapp.server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    # The run form's checks run in a sandboxed child of a warm checking server; start it now.
    from training import probe

    threading.Thread(target=probe.warm, name="run-checker-warmup", daemon=True).start()
    uvicorn.run(
        "webapp.asgi:application", host=args.host, port=args.port, log_level=args.log_level, backlog=BACKLOG,
        loop="uvloop", http="httptools", ws="websockets-sansio",
        # Channels' router has no ASGI lifespan handler; saying so keeps a startup warning away.
        lifespan="off",
    )


if __name__ == "__main__":
    main()
