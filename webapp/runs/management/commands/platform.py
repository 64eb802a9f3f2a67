"""``python manage.py platform``: the whole platform in one command, nothing external needed.

Migrates, seeds the registry, creates a demo login, starts the web server (uvicorn, webapp/server.py), a Celery
worker with one slot for runs and one for the playground (a worker of its own on the ``playground`` queue, so a
question to a trained model is answered while a run trains), queues a demo run, prints the URL and login, and
runs until Ctrl-C. The address and the login are $PLATFORM_HOST, $PLATFORM_PORT, $PLATFORM_DEMO_USERNAME and
$PLATFORM_DEMO_PASSWORD (settings), or these flags.

Without REDIS_URL the worker and the web server talk through kombu's filesystem transport
(messages are files under var/broker/), so no broker server is needed; with REDIS_URL set they
use Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from training.utils import cuda_device_count
from webapp import server
from webapp.privileges import drop_root
from webapp.registry.models import Agent, Backend, Dataset, RewardFunction
from webapp.registry.seed import demo_run
from webapp.runs.forms import RunForm
from webapp.runs.models import Run
from webapp.runs.submission import submit


# The playground's own worker's queue: no backend's queue, so no run ever waits for it.
PLAYGROUND_QUEUE = "playground"


class Command(BaseCommand):
    help = "Run the whole platform (web server + worker) on this machine until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.PLATFORM_HOST, help="default: $PLATFORM_HOST, else 127.0.0.1")
        parser.add_argument("--port", type=int, default=settings.PLATFORM_PORT, help="default: $PLATFORM_PORT, else 8000")
        parser.add_argument("--username", default=settings.PLATFORM_DEMO_USERNAME,
                            help="the administrator login to create: $PLATFORM_DEMO_USERNAME, else demo")
        parser.add_argument("--password", default=settings.PLATFORM_DEMO_PASSWORD,
                            help="its password (reset to this at each start): $PLATFORM_DEMO_PASSWORD, else demo")
        parser.add_argument("--queues", default=None, help="Queues the worker takes (default: cpu, plus gpu with a GPU).")
        parser.add_argument("--no-demo-run", action="store_true", help="Do not queue the demo run.")
        parser.add_argument("--no-worker", action="store_true", help="Start no worker (start your own).")
        parser.add_argument("--playground-queue", default=os.environ.get("PLAYGROUND_QUEUE", PLAYGROUND_QUEUE),
                            help="Queue of the playground's own worker (empty: questions wait for a slot of the runs' queue).")

    def handle(self, *args, **options):
        drop_root(settings.VAR_DIR)  # before anything is written: what it makes belongs to the platform's user
        for folder in (settings.VAR_DIR, settings.RUNS_DIR, settings.BROKER_DIR / "messages", settings.BROKER_DIR / "control"):
            os.makedirs(folder, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_registry", enable_gpu_backends=self._gpu_count() > 0)
        user = self._demo_user(options["username"], options["password"])

        url = f"http://{options['host']}:{options['port']}/"
        os.environ.setdefault("PLATFORM_URL", url)  # the web server's and worker's links (alerts) point here
        children: list[subprocess.Popen] = []
        signal.signal(signal.SIGTERM, _interrupt)  # docker stop / kill: shut down like Ctrl-C
        try:
            if not options["no_worker"]:
                if options["playground_queue"]:  # before any child starts: the web server sends questions there
                    os.environ["PLAYGROUND_QUEUE"] = options["playground_queue"]
                    children.append(self._start_playground_worker(options["playground_queue"]))
                children.append(self._start_worker(options["queues"]))
            children.append(self._start_web(options["host"], options["port"]))
            demo = None if options["no_demo_run"] else self._queue_demo_run(user)
            broker = "Redis" if settings.REDIS_URL else f"files under {settings.BROKER_DIR}"
            watch = f"  demo run (multi-turn FrozenLake, reward climbs in a minute or two): {url.rstrip('/')}{demo.get_absolute_url()}\n" if demo else ""
            self.stdout.write(self.style.SUCCESS(
                f"\nPlatform running at {url}\n  login: {options['username']} / {options['password']} (an administrator)\n"
                f"{watch}  broker: {broker}\n  database: {settings.DATABASES['default']['NAME']}\nCtrl-C to stop.\n"
            ))
            while all(child.poll() is None for child in children):
                time.sleep(1)
            self.stderr.write("A platform process exited; stopping the others.")
        except KeyboardInterrupt:
            self.stdout.write("\nStopping…")
        finally:
            self._stop(children)

    # -- parts -----------------------------------------------------------------------------------
    def _gpu_count(self) -> int:
        return cuda_device_count()

    def _demo_user(self, username: str, password: str):
        User = get_user_model()
        user, created = User.objects.get_or_create(username=username, defaults={"is_staff": True, "is_superuser": True})
        if created or not user.check_password(password):
            user.set_password(password)
            user.save()
        return user

    def _start_worker(self, queues: str | None) -> subprocess.Popen:
        queues = queues or ("cpu,gpu" if self._gpu_count() else "cpu")
        command = [
            sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", queues, "--concurrency", "1",
            "--loglevel", "INFO", "-n", "embedded@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        self.stdout.write(f"Starting worker: {' '.join(command[1:])}")
        return subprocess.Popen(command, cwd=settings.BASE_DIR)

    def _start_playground_worker(self, queue: str) -> subprocess.Popen:
        """One slot that only answers playground questions: the runs' worker trains one run at a time,
        and a question behind a 150-step run would wait minutes. Its warm process (``RUN_WARM_PROCESS``)
        forks each answer's process with torch and transformers imported."""
        command = [
            sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", queue, "--concurrency", "1",
            "--loglevel", "INFO", "-n", "playground@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        self.stdout.write(f"Starting playground worker: {' '.join(command[1:])}")
        return subprocess.Popen(command, cwd=settings.BASE_DIR)

    def _start_web(self, host: str, port: int) -> subprocess.Popen:
        command = server.command(host, port)
        self.stdout.write(f"Starting web server: {' '.join(command[1:])}")
        return subprocess.Popen(command, cwd=settings.BASE_DIR)

    def _queue_demo_run(self, user) -> Run | None:
        demo = demo_run()
        form = RunForm(data={
            "name": "demo", "agent": _pk(Agent, demo["agent"]), "dataset": _pk(Dataset, demo["dataset"]),
            "reward": _pk(RewardFunction, demo["reward"]), "backend": _pk(Backend, demo["backend"]),
            "model": demo["model"], "overrides": demo["overrides"],
        })
        if not form.is_valid():
            problems = "; ".join(f"{field or 'form'}: {' '.join(errors)}" for field, errors in form.errors.items())
            self.stderr.write(f"The demo run is not valid, so it is not queued: {problems}")
            return None
        data = form.cleaned_data
        return submit(
            owner=user, name="demo: FrozenLake", agent=data["agent"], dataset=data["dataset"], reward=data["reward"],
            backend=data["backend"], model=data["model"], config_overrides=data["overrides"], spec=form.spec,
        )

    def _stop(self, children: list[subprocess.Popen]) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _pk(model, name: str) -> str:
    row = model.objects.filter(name=name).first()
    return str(row.pk) if row else ""
