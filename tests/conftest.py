"""Shared fixtures: named personas (owner, teammate, viewer, stranger, admin) and the example registry.

Django is imported lazily so that library tests (tests/training) run without it.
"""

from __future__ import annotations

import functools
import os

import pytest

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# The suite runs as root on CI and its servers and workers use folders the tests made as root:
# they may stay root here (webapp/privileges.py). tests/security/test_not_root.py unsets it.
os.environ.setdefault("PLATFORM_ALLOW_ROOT", "1")
# The workers the tests start have no warm process of their own (RUN_WARM_PROCESS, on in production)
# unless the test turns it on: it imports torch once for the worker (about 7 CPU-s), worth it only for
# a worker that starts more than one child (tests/browser/conftest.py's does; tests/reliability/test_warm_process.py
# and tests/workers/test_celery_end_to_end.py test it). Their children fork from the session's warm
# process instead (tests/platform_slots.py), as a pool process forks from its worker's.
os.environ.setdefault("RUN_WARM_PROCESS", "0")



def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.redis`` tests need a Redis server (REDIS_URL); ``@pytest.mark.browser`` tests
    need Chromium and Playwright; ``@pytest.mark.gpu`` tests need CUDA. Each is skipped, with the
    reason, where that is missing."""
    missing = {
        "redis": None if os.environ.get("REDIS_URL") else "needs REDIS_URL (a Redis server)",
        "browser": _browser_missing(),
        "gpu": _gpu_missing(),
    }
    for item in items:
        for marker, reason in missing.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


# The sandboxed run check (the form's, the API's, a sweep trial's, a clone's) builds the run's whole
# trainer in the jail. Tests in these folders are about access, layout, other fields and the API's
# shape: they get ``fake_run_check`` unless marked ``real_check``. Each path that submits a run keeps
# tests marked ``real_check`` (and tests/security's, tests/workers', the browser's all build for real).
FAKE_RUN_CHECK_IN = {"api", "fleet", "integrations", "registry", "sweeps", "teams", "webapp"}
# Where the check is called, by the name its caller imported: the one place to change if it moves.
RUN_CHECK_AT = "webapp.runs.forms.check_isolated"


@pytest.fixture
def fake_run_check(monkeypatch):
    """Stands in for the jailed build of a run's trainer (``webapp.policy.checks.check_isolated``), for tests
    that are not about it. Answers as the real check does for a valid run: ``{"ok": True,
    "final_config": ...}`` with the library's final config of the run's merged config
    (``Config.build``, in this process: no registry code is imported); a config the library refuses
    gets the real check's refusal of it (``probe._refusal``: the key, the message, every problem).
    Returns the specs it was asked to check."""
    import importlib

    from training.config import Config
    from training.platform.probe import _refusal

    module, _, name = RUN_CHECK_AT.rpartition(".")
    module = importlib.import_module(module)
    asked = []

    def check(spec):
        asked.append(spec)
        try:
            final = Config.build(spec["kwargs"]["config"])
        except ValueError as exc:  # ConfigError, Problems: as ``probe.check`` answers them
            return _refusal(exc)
        return {"ok": True, "final_config": final.to_dict()}

    monkeypatch.setattr(module, name, check)
    return asked


@pytest.fixture(autouse=True)
def _datasets_of_this_test(monkeypatch, tmp_path_factory):
    """``DatasetRegistry`` keeps datasets on disk: each test gets a registry of its own, so a split
    one test registers (``countdown``, say) never replaces a built-in one in the next."""
    monkeypatch.setenv("AGENT_TRAINER_DATASETS", str(tmp_path_factory.mktemp("datasets")))


@pytest.fixture(autouse=True)
def _run_check_by_folder(request):
    folder = request.node.path.relative_to(request.config.rootpath / "tests").parts[0]
    if folder in FAKE_RUN_CHECK_IN and request.node.get_closest_marker("real_check") is None:
        request.getfixturevalue("fake_run_check")


def _browser_missing() -> str | None:
    import importlib.util
    import shutil

    if not (os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")):
        return "needs Chromium (apt-get install chromium chromium-driver)"
    if importlib.util.find_spec("playwright") is None:
        return "needs the playwright package"
    return None


def _gpu_missing() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU"

# A migrated test database, kept between runs as a PostgreSQL template (``CREATE DATABASE ... TEMPLATE``
# copies its files in a fraction of a second, where the migrations take seconds of each process's
# CPU). Its name carries a digest of every migration the project and its apps have, so a new or edited
# migration makes a new template; older ones are dropped when it is made.
_TEMPLATE_LOCK = 7_461_203  # a PostgreSQL advisory lock: one process at a time copies or makes a template


def _migrations_digest() -> str:
    import hashlib
    import sys
    from pathlib import Path

    from django.db.migrations.loader import MigrationLoader

    digest = hashlib.sha256()
    loader = MigrationLoader(None, ignore_no_migrations=True)
    for key in sorted(loader.disk_migrations):
        digest.update(repr(key).encode())
        digest.update(Path(sys.modules[type(loader.disk_migrations[key]).__module__].__file__).read_bytes())
    return digest.hexdigest()[:12]


def _template_of(test_name: str) -> tuple[str, str]:
    """The template's name and the prefix every template of these test databases has."""
    import re

    prefix = re.sub(r"_gw\d+$", "", test_name)[:40] + "_tmpl_"
    return prefix + _migrations_digest(), prefix


@pytest.fixture(scope="session")
def django_db_keepdb(request, django_db_modify_db_settings, django_db_blocker) -> bool:
    """pytest-django's ``--reuse-db``; else, where a template of the migrated test database exists,
    this process's test database is made afresh as a copy of it and kept as made (no migrations to
    run: Django's ``migrate`` finds them all applied)."""
    if request.config.getvalue("reuse_db"):
        return True
    if request.config.getvalue("create_db"):
        return False
    from django.db import DatabaseError, connection

    if connection.vendor != "postgresql":
        return False
    name = connection.creation._get_test_db_name()
    template, _ = _template_of(name)
    quote = connection.ops.quote_name
    with django_db_blocker.unblock(), connection._nodb_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [_TEMPLATE_LOCK])
        try:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [template])
            if cursor.fetchone() is None:
                return False
            cursor.execute(f"DROP DATABASE IF EXISTS {quote(name)}")
            cursor.execute(f"CREATE DATABASE {quote(name)} TEMPLATE {quote(template)}")
        except DatabaseError:  # a session still on the old database, say: Django makes it as before
            return False
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_TEMPLATE_LOCK])
    return True


def _keep_as_template(connection) -> None:
    """Copy the just-migrated test database into the template the next runs start from."""
    from django.db import DatabaseError

    name = connection.settings_dict["NAME"]
    template, prefix = _template_of(name)
    quote = connection.ops.quote_name
    connection.close()  # a database with a session on it cannot be copied
    with connection._nodb_cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [_TEMPLATE_LOCK])
        try:
            cursor.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [prefix])
            templates = {row[0] for row in cursor.fetchall()}
            if template not in templates:
                cursor.execute(f"CREATE DATABASE {quote(template)} TEMPLATE {quote(name)}")
            for old in templates - {template}:
                cursor.execute(f"DROP DATABASE IF EXISTS {quote(old)}")
        except DatabaseError:  # another session on it: the next run makes the template
            pass
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_TEMPLATE_LOCK])


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker, django_db_keepdb):
    """The test database that pytest-django created (or copied from the template: kept as a template
    if it was migrated here), made cheaper to reset on PostgreSQL:

    - A transactional test ends with Django's flush, one ``TRUNCATE`` of every table: PostgreSQL
      makes new files for each table and index, 1-1.7 s per test on a busy machine. Deleting the few
      rows a test leaves takes 0.02 s and leaves the same empty tables (sequences are not reset by
      either; a flush that resets them or cascades is still a TRUNCATE). Django's foreign keys are
      deferrable, so the deletes' order does not matter.
    - ``synchronous_commit = off`` for every connection to it (this process's and the workers' and
      servers' that tests start): a commit returns before its WAL record is flushed to the disk.
      What others see is the same; only a crash could lose the last commits of a throwaway database.
    """
    import time

    from django.db import OperationalError, connection
    from django.db.backends.postgresql.operations import DatabaseOperations
    from psycopg import errors

    truncate, execute_flush = DatabaseOperations.sql_flush, DatabaseOperations.execute_sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return ["SET CONSTRAINTS ALL DEFERRED;", *(f"DELETE FROM {self.quote_name(table)};" for table in tables)]

    def execute_sql_flush(self, sql_list):
        # Deletes, unlike TRUNCATE, take row locks one table at a time: a process the test started
        # that still writes (a training process folding its ended run's metrics locks the run's row,
        # then the points the flush already deleted) deadlocks with them instead of being waited for.
        # PostgreSQL rolls one of the two back; when it is the flush, it runs again.
        for attempt in range(5):
            try:
                return execute_flush(self, sql_list)
            except OperationalError as exc:
                if not isinstance(exc.__cause__, errors.DeadlockDetected) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql" and not django_db_keepdb:
            _keep_as_template(connection)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER DATABASE {connection.ops.quote_name(connection.settings_dict['NAME'])} "
                               "SET synchronous_commit = off")
            connection.close()  # the setting applies to connections opened from now on
    DatabaseOperations.sql_flush, DatabaseOperations.execute_sql_flush = sql_flush, execute_sql_flush
    yield
    DatabaseOperations.sql_flush, DatabaseOperations.execute_sql_flush = truncate, execute_flush


# Small enough to train in seconds on one CPU core.
TINY_OVERRIDES = "trainer.total_training_steps=3\ndata.train_batch_size=2\nactor_rollout_ref.rollout.n=2\ndata.max_response_length=4\n"


def _user(username: str, **extra):
    """A persona whose password is ``<username>-password``. The hash is made once per password and
    hasher setting and then reused: the default hasher's rounds cost a fifth of a second per user
    (more on a busy machine), and hundreds of tests create personas. The stored hash is a real one of
    the configured hasher, so logging in through a form (here or in a server process) checks it."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username=username, password=None, **extra)
    user.password = _password_hash(f"{username}-password", tuple(settings.PASSWORD_HASHERS))
    user.save(update_fields=["password"])
    return user


@functools.cache
def _password_hash(password: str, hashers: tuple[str, ...]) -> str:
    from django.contrib.auth.hashers import make_password

    return make_password(password)


@pytest.fixture
def owner(db):
    return _user("owner")


@pytest.fixture
def stranger(db):
    return _user("stranger")


@pytest.fixture
def admin_user(db):
    return _user("admin", is_staff=True, is_superuser=True)


@pytest.fixture
def team(owner):
    """A team with a project; ``owner`` owns it (teammates and viewers join through their fixtures)."""
    from webapp.teams.models import Membership, Project, Team

    team = Team.objects.create(name="Lake team", slug="lake")
    Membership.objects.create(team=team, user=owner, role=Membership.Role.OWNER)
    team.project = Project.objects.create(team=team, name="frozenlake")
    return team


@pytest.fixture
def project(team):
    return team.project


@pytest.fixture
def teammate(team):
    """A member of ``team``: sees team-visible runs and may clone them; may not edit or cancel them."""
    from webapp.teams.models import Membership

    user = _user("teammate")
    Membership.objects.create(team=team, user=user, role=Membership.Role.MEMBER)
    return user


@pytest.fixture
def viewer(team):
    """A viewer in ``team``: sees team-visible runs, nothing more."""
    from webapp.teams.models import Membership

    user = _user("viewer")
    Membership.objects.create(team=team, user=user, role=Membership.Role.VIEWER)
    return user


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client


@pytest.fixture
def stranger_client(client, stranger):
    client.force_login(stranger)
    return client


@pytest.fixture
def admin_client_(client, admin_user):
    client.force_login(admin_user)
    return client


class _SeededRows:
    """``seed_registry``'s rows, made again with a few queries where its outcome is already known.

    ``seed_registry`` updates or creates row by row (~80 queries, a tenth of a second or more on a
    busy machine) and hundreds of tests start from its rows. Its outcome depends only on the registry
    rows there before it (the test database's migrations leave a ``tiny-char`` model; a transactional
    test's flush leaves none). So for each such starting state the first seeding in this process is
    the real one, and the rows it leaves (every field but the creation time) and the agents' tools are
    kept; a later test starting from the same state gets the same rows: the rows that were there are
    updated to those values, the others made by one ``bulk_create`` per table (the insert sets each
    creation time anew, as ``save`` does). A starting state with agents or tools in it (a test made
    some) is always seeded by ``seed_registry`` itself."""

    def __init__(self):
        self.outcomes = {}  # starting rows -> (rows after seeding, {agent name: its tools' names})

    def seed(self) -> None:
        from webapp.registry.seed import seed_registry

        before = self.rows()
        key = repr(before)
        outcome = self.outcomes.get(key)
        if outcome is not None:
            self.replay(before, *outcome)
            return
        seed_registry()
        if not any(before[model] for model in self.with_tools()):
            self.outcomes[key] = (self.rows(), self.tools())

    @staticmethod
    def models():
        from webapp.registry.models import Agent, Backend, Dataset, Model, RewardFunction, Tool

        return (Tool, Agent, Dataset, Model, RewardFunction, Backend)

    @staticmethod
    def with_tools():
        from webapp.registry.models import Agent, Tool

        return (Tool, Agent)

    @staticmethod
    def fields(model):
        return [field for field in model._meta.concrete_fields if not field.primary_key and field.name != "created_at"]

    def rows(self) -> dict:
        """Each table's rows in pk order: (pk, {field: value}), creation times left out."""
        return {model: [(row.pk, {field.attname: field.value_from_object(row) for field in self.fields(model)})
                        for row in model.objects.order_by("pk")] for model in self.models()}

    @staticmethod
    def tools() -> dict:
        from webapp.registry.models import Agent

        return {agent.name: sorted(agent.tools.values_list("name", flat=True)) for agent in Agent.objects.all()}

    def replay(self, before: dict, after: dict, tools: dict) -> None:
        import copy

        from webapp.registry.models import Agent, Tool

        made = {}
        for model in self.models():
            there = dict(before[model])
            for pk, values in after[model]:
                if pk in there and there[pk] != values:
                    model.objects.filter(pk=pk).update(**copy.deepcopy(values))
            made[model] = model.objects.bulk_create(
                [model(**copy.deepcopy(values)) for pk, values in after[model] if pk not in there])
        tool_pk = {tool.name: tool.pk for tool in made[Tool]}
        Agent.tools.through.objects.bulk_create([
            Agent.tools.through(agent_id=agent.pk, tool_id=tool_pk[name])
            for agent in made[Agent] for name in tools[agent.name]
        ])


_seeded_rows = _SeededRows()


@pytest.fixture
def registry_seeding():
    """The ``registry`` fixture's seeding, for the tests that hold it to ``seed_registry``'s rows."""
    return _seeded_rows


@pytest.fixture
def registry(db):
    """The example rows (agents, datasets, rewards, backends), by name."""
    from webapp.registry.models import Agent, Backend, Dataset, RewardFunction

    _seeded_rows.seed()
    return {
        "agents": {a.name: a for a in Agent.objects.all()},
        "datasets": {d.name: d for d in Dataset.objects.all()},
        "rewards": {r.name: r for r in RewardFunction.objects.all()},
        "backends": {b.name: b for b in Backend.objects.all()},
    }


@pytest.fixture
def copy_form_data(registry):
    """Form data of a valid tiny single-turn run (the copy task on TRL)."""
    return {
        "name": "tiny copy",
        "agent": registry["agents"]["copy-task"].pk,
        "dataset": registry["datasets"]["copy"].pk,
        "reward": registry["rewards"]["char-accuracy"].pk,
        "backend": registry["backends"]["trl"].pk,
        "model": "tiny-char",
        "overrides": TINY_OVERRIDES,
    }


@pytest.fixture
def no_queue(monkeypatch):
    """Runs are created but not sent to a worker."""
    from webapp.runs.models import Run

    monkeypatch.setattr(Run, "enqueue", lambda self: None)


@pytest.fixture
def make_run(registry, owner):
    """Create a Run row of the tiny copy task directly (no form, no queue)."""
    from webapp.runs.models import Run

    def make(**fields):
        values = {
            "owner": owner, "agent": registry["agents"]["copy-task"], "dataset": registry["datasets"]["copy"],
            "reward": registry["rewards"]["char-accuracy"], "backend": registry["backends"]["trl"],
            "model": "tiny-char",
            "config_overrides": {"trainer.total_training_steps": 2, "data.train_batch_size": 2, "actor_rollout_ref.rollout.n": 2,
                                 "data.max_response_length": 4},
        }
        values.update(fields)
        return Run.objects.create(**values)

    return make


@pytest.fixture
def page_client():
    """A Django test client logged in as ``user`` (None: anonymous)."""
    from django.test import Client

    def make(user, **kwargs):
        client = Client(**kwargs)
        if user is not None:
            client.force_login(user)
        return client

    return make


@pytest.fixture
def token_of():
    from rest_framework.authtoken.models import Token

    return lambda user: Token.objects.get_or_create(user=user)[0].key


@pytest.fixture
def api_client(token_of):
    """A DRF client authenticated with ``user``'s API token (None: no credentials)."""
    from rest_framework.test import APIClient

    def make(user):
        client = APIClient()
        if user is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Token {token_of(user)}")
        return client

    return make


@pytest.fixture
def ws_connect():
    """Open the run websocket ``/ws/runs/<id>/?query`` as ``user`` (None: anonymous), with a session
    cookie, through the same middleware stack as ``webapp.asgi``. Returns (communicator, connected)."""
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from webapp.dashboard.routing import websocket_urlpatterns

    application = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))

    async def connect(user, run_id: int, query: str = ""):
        from channels.db import database_sync_to_async

        headers = []
        if user is not None:
            client = Client()
            await database_sync_to_async(client.force_login)(user)
            headers = [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]
        communicator = WebsocketCommunicator(application, f"/ws/runs/{run_id}/?{query}", headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        return communicator, connected

    return connect


@pytest.fixture(scope="module")
def warm_process(django_db_setup, django_db_blocker):
    """A worker's warm process (``workers.processes.start_warm_process``) for the children this test
    process starts, as a worker with ``RUN_WARM_PROCESS`` has; stopped, and its address gone, after
    the module."""
    from workers import processes

    import time

    session_address = os.environ.get(processes.WARM_PROCESS_ADDRESS)  # the session's (tests/platform_slots.py)
    with django_db_blocker.unblock():
        process = processes.start_warm_process()
    address = os.environ[processes.WARM_PROCESS_ADDRESS]
    deadline = time.monotonic() + 180  # a hang guard: it listens once it has imported (seconds)
    while not os.path.exists(address):  # before, a child would start plain
        assert process.poll() is None and time.monotonic() < deadline, "the warm process did not start listening"
        time.sleep(0.1)
    yield process
    processes.stop_warm_process(process)
    assert processes.WARM_PROCESS_ADDRESS not in os.environ
    assert process.returncode is not None and not os.path.exists(address)
    if session_address:
        os.environ[processes.WARM_PROCESS_ADDRESS] = session_address
