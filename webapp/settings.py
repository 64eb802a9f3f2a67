"""The one settings module. Every knob is an environment variable with a default that works on a
fresh laptop (SQLite, a file-system broker under var/, an in-process channel layer).

A bad value raises ImproperlyConfigured naming the variable.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from training.isolation.egress import parse_allowed_hosts

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def envbool(name: str, default: str) -> bool:
    value = os.environ.get(name, default).strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false (1/0, yes/no, on/off), not {value!r}.")


def envint(name: str, default: str, minimum: int | None = None, maximum: int | None = None) -> int:
    value = os.environ.get(name, default).strip()
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, not {value!r}.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {number}.")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, not {number}.")
    return number


def envtext(name: str, default: str) -> str:
    """A variable that must not be blank when set (a login name, a host)."""
    value = os.environ.get(name, default).strip()
    if not value:
        raise ImproperlyConfigured(f"{name} is set but empty; unset it for the default {default!r}, or give a value.")
    return value


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def envhosts(name: str) -> tuple[str, ...]:
    try:
        return parse_allowed_hosts(os.environ.get(name, ""))
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None


def envdatabase(name: str, default: str) -> dict:
    value = os.environ.get(name, "").strip() or default
    try:
        config = dj_database_url.parse(value, conn_max_age=0)
    except Exception as exc:  # dj-database-url raises ValueError/KeyError on unknown schemes
        raise ImproperlyConfigured(f"{name} is not a database URL Django can use ({value!r}): {exc}") from None
    if not config.get("ENGINE"):
        raise ImproperlyConfigured(f"{name} names no database engine: {value!r}.")
    return config


def envredis(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    if value and not value.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"{name} must start with redis://, rediss:// or unix://, not {value!r}.")
    return value or None


def secret_key(var_dir: Path) -> str:
    """$SECRET_KEY, else a random key made once and kept in ``var_dir/secret_key`` (readable by its
    owner only), so that sessions survive a restart and no key is shared between installs."""
    value = os.environ.get("SECRET_KEY", "").strip()
    if value:
        return value
    path = var_dir / "secret_key"
    if not path.exists():
        import secrets
        import tempfile

        var_dir.mkdir(parents=True, exist_ok=True)
        # Written aside, then linked into place: processes starting together all read one whole key.
        with tempfile.NamedTemporaryFile("w", dir=var_dir, prefix=".secret_key.", delete=False) as file:
            file.write(secrets.token_urlsafe(50))
        try:
            os.link(file.name, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(file.name)
    return path.read_text().strip()


# Where runs write checkpoints and logs, and where the embedded broker keeps its messages.
VAR_DIR = Path(os.environ.get("PLATFORM_VAR_DIR", "").strip() or BASE_DIR / "var")
RUNS_DIR = VAR_DIR / "runs"
# Directories under which admins may register models by path (registry Model entries); runs name
# models only through those entries, never by a path of their own.
MODEL_ROOTS = [Path(p) for p in envlist("MODEL_ROOTS", str(VAR_DIR / "models"))]

# Off unless asked for: Django's debug pages list every URL pattern and setting to whoever asks.
DEBUG = envbool("DEBUG", "false")
SECRET_KEY = secret_key(VAR_DIR)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "webapp.registry",
    "webapp.runs",
    "webapp.dashboard",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files for /api/docs/, served from the package (no CDN)
    "axes",  # login lockout: repeated wrong passwords for one account from one address
    "webapp.teams",
    "webapp.api",
    "webapp.fleet",
    "webapp.integrations",
    "webapp.sweeps",
    "webapp.playground",
    "webapp.checkpoints",
    "webapp.monitors",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out login into its 429 page
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"
ASGI_APPLICATION = "webapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "webapp" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": envdatabase("DATABASE_URL", f"sqlite:///{VAR_DIR / 'platform.sqlite3'}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    VAR_DIR.mkdir(parents=True, exist_ok=True)  # the default database lives there
    # A file (not :memory:) so that worker processes started by tests share the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-platform.sqlite3")}
    # Workers and the web server write at once. A transaction takes the write lock when it begins
    # (IMMEDIATE), so it waits its turn up to the timeout: a deferred one that read first and then
    # wrote while another process was writing failed at once with "database is locked" (SQLite
    # cannot make it wait), which a run's locked metric writes made frequent. WAL: readers never
    # wait for the writer.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
# Connections kept open per process (psycopg's pool; 0: each request opens and closes its own). A
# PostgreSQL connection costs ~30 ms to open on a loaded machine and a run page's websocket needs
# several database reads to open: the web server (webapp/server.py) sets a pool of its own unless
# this is given. Only for PostgreSQL.
DATABASE_POOL_SIZE = envint("DATABASE_POOL_SIZE", "0", minimum=0)
if DATABASE_POOL_SIZE and DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": DATABASE_POOL_SIZE}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # refuses a locked-out account before the password is checked
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs:list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# Let the ASGI server serve static files itself (admin CSS): one process is enough for a small team.
SERVE_STATIC = envbool("SERVE_STATIC", "true")

MEDIA_ROOT = VAR_DIR / "uploads"
MEDIA_URL = "media/"
# Uploaded datasets (project members upload CSV / JSONL / Parquet from the browser). Files are never
# served as they are: only the project's pages read them. The limits bound what one upload costs.
DATASET_UPLOAD_MAX_BYTES = envint("DATASET_UPLOAD_MAX_BYTES", str(20 * 1024 * 1024), minimum=1024)
DATASET_UPLOAD_MAX_ROWS = envint("DATASET_UPLOAD_MAX_ROWS", "100000", minimum=1)
DATASET_UPLOAD_MAX_COLUMNS = envint("DATASET_UPLOAD_MAX_COLUMNS", "200", minimum=1)
DATASET_UPLOAD_MAX_CELL_CHARS = envint("DATASET_UPLOAD_MAX_CELL_CHARS", "100000", minimum=100)
# Parquet is read in a child process with this much memory (on top of what pyarrow maps) and CPU time.
DATASET_PARSE_MEMORY_MB = envint("DATASET_PARSE_MEMORY_MB", "1024", minimum=64)
DATASET_PARSE_CPU_SECONDS = envint("DATASET_PARSE_CPU_SECONDS", "30", minimum=1)
# Anyone may make an account at /signup/ (off: accounts come from invitations and the admin).
SIGNUP_OPEN = envbool("SIGNUP_OPEN", "false")
INVITATION_DAYS = envint("INVITATION_DAYS", "7", minimum=1)

# The compare page's downsampled series of ended runs (webapp.dashboard.series.downsample_ended),
# kept this long; 0: not kept. In Redis when REDIS_URL is given (every web process shares it), else
# in each process's memory.
SERIES_CACHE_SECONDS = envint("SERIES_CACHE_SECONDS", "3600", minimum=0)
SERIES_CACHE_MEMORY_ENTRIES = 20_000  # about 8 kB each: a thousand runs x four charts x five widths

# Redis, when given, carries both Celery messages and the Channels layer. Without it the platform
# runs with no server at all: Celery's messages go through files under var/broker (kombu's
# filesystem transport, shared by every process on this machine).
REDIS_URL = envredis("REDIS_URL")
BROKER_DIR = VAR_DIR / "broker"
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "series": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "series",
               "OPTIONS": {"MAX_ENTRIES": SERIES_CACHE_MEMORY_ENTRIES}},
}
if REDIS_URL:
    CACHES["series"] = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                        "KEY_PREFIX": "platform"}
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {"visibility_timeout": 7 * 24 * 3600}
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
    }
else:
    CELERY_BROKER_URL = "filesystem://localhost//"  # kombu warns at every connection when the host is left out
    for _folder in ("messages", "control"):
        (BROKER_DIR / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "messages"),
        "data_folder_out": str(BROKER_DIR / "messages"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
    }
    # The web server and the worker are separate processes: they share channels through files.
    CHANNEL_LAYERS = {"default": {
        "BACKEND": "webapp.dashboard.filelayer.FileChannelLayer", "CONFIG": {"path": str(VAR_DIR / "channels")},
    }}

# Web server processes (``python -m webapp.server``), all serving one port over the same channel
# layer. One process holds about 1,000 websocket viewers of a run within 100 ms (docs/scaling.md);
# each extra one costs a Django process's memory (~150 MB) and its own run checker.
WEB_PROCESSES = envint("WEB_PROCESSES", "2", minimum=1)

CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a worker that dies mid-run does not lose the message silently
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # one run per worker process (one per GPU on GPU workers)
CELERY_TASK_DEFAULT_QUEUE = "cpu"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Run lifecycle.
RUN_HEARTBEAT_SECONDS = envint("RUN_HEARTBEAT_SECONDS", "2", minimum=1)
# A running platform run whose worker sent no heartbeat for this long is lost: it is queued again
# (or failed after its backend's max_attempts). Detected within this plus RUN_SWEEP_SECONDS. Five
# missed heartbeats; a sweeper that was itself starved by the load waits a whole window again.
RUN_STALE_SECONDS = envint("RUN_STALE_SECONDS", "10", minimum=2)
if RUN_STALE_SECONDS <= RUN_HEARTBEAT_SECONDS:
    raise ImproperlyConfigured("RUN_STALE_SECONDS must be longer than RUN_HEARTBEAT_SECONDS.")
# External runs report from elsewhere (training.platform.reporter heartbeats every 20 s): failed after this long silent.
EXTERNAL_RUN_STALE_SECONDS = envint("EXTERNAL_RUN_STALE_SECONDS", "120", minimum=10)
# How often each worker's housekeeping thread looks for lost runs and sends due queued runs.
RUN_SWEEP_SECONDS = envint("RUN_SWEEP_SECONDS", "2", minimum=1)
# A queued run sent to its queue but not claimed within this long is sent again (a message lost
# with the broker); a duplicate is harmless, the claim takes a run once.
RUN_REDISPATCH_SECONDS = envint("RUN_REDISPATCH_SECONDS", "300", minimum=1)
# On SIGTERM (a deploy) a worker's runs save a checkpoint at their next step and are queued again;
# a run that has not stopped after this long is killed and resumes from its previous checkpoint.
RUN_SHUTDOWN_GRACE_SECONDS = envint("RUN_SHUTDOWN_GRACE_SECONDS", "60", minimum=1)
# While the database is down a run goes on: a training process's reports wait in a spool in the
# run's folder (up to RUN_SPOOL_MAX_MB per writer; reports over the API in memory, up to
# RUN_BUFFER_MAX_POINTS metric points per run) and row changes are retried for this long.
RUN_DATABASE_RETRY_SECONDS = envint("RUN_DATABASE_RETRY_SECONDS", "900", minimum=1)
RUN_BUFFER_MAX_POINTS = envint("RUN_BUFFER_MAX_POINTS", "1000000", minimum=1000)
RUN_SPOOL_MAX_MB = envint("RUN_SPOOL_MAX_MB", "512", minimum=1)
# Episodes of the episode store (every episode, whole) a training process holds in memory while they
# wait to be written; past it a step's episodes are dropped whole and counted (docs/dashboard.md).
RUN_BUFFER_MAX_EPISODES = envint("RUN_BUFFER_MAX_EPISODES", "20000", minimum=100)
# An export of the episode store (format=jsonl / parquet) streams for at most this long; past it the
# file ends with a note saying where it was cut and how to fetch the rest (docs/dashboard.md).
EPISODE_EXPORT_MAX_SECONDS = envint("EPISODE_EXPORT_MAX_SECONDS", "300", minimum=1)
# When the disk of a run's folder is full: "continue" drops reports that do not fit (counted, and
# told on the run's log and page) and fails the run when a checkpoint does not fit, naming the
# folder and its free space; "pause" holds the attempt's writes (training waits) and tries again
# every RUN_FULL_DISK_CHECK_SECONDS until the disk takes them, told once on the run's log.
RUN_ON_FULL_DISK = os.environ.get("RUN_ON_FULL_DISK", "continue").strip().lower()
if RUN_ON_FULL_DISK not in ("continue", "pause"):
    raise ImproperlyConfigured(f"RUN_ON_FULL_DISK must be continue or pause, not {RUN_ON_FULL_DISK!r}.")
RUN_FULL_DISK_CHECK_SECONDS = envint("RUN_FULL_DISK_CHECK_SECONDS", "5", minimum=1)
# Each worker starts a warm process, its libraries imported once (torch, transformers, TRL: seconds),
# that forks its children (runs, playground answers, evaluations; workers.processes), so each starts
# that much sooner and cheaper; a resumed run trains again sooner too.
RUN_WARM_PROCESS = envbool("RUN_WARM_PROCESS", "true")
# A lost remote run's paid resources (fireworks trainer job, deployment) that could not be deleted
# are tried again after RUN_RELEASE_BACKOFF_SECONDS * 2 ** (tries - 1), at most
# RUN_RELEASE_BACKOFF_MAX_SECONDS apart; each sweep starts at most RUN_RELEASE_BATCH of them. A
# deletion under way holds its run for RUN_RELEASE_LEASE_SECONDS (the SDK retries an unreachable
# service for minutes): one its worker's exit cut short is taken up again once that has passed.
RUN_RELEASE_BACKOFF_SECONDS = envint("RUN_RELEASE_BACKOFF_SECONDS", "60", minimum=1)
RUN_RELEASE_BACKOFF_MAX_SECONDS = envint("RUN_RELEASE_BACKOFF_MAX_SECONDS", "3600", minimum=1)
if RUN_RELEASE_BACKOFF_MAX_SECONDS < RUN_RELEASE_BACKOFF_SECONDS:
    raise ImproperlyConfigured("RUN_RELEASE_BACKOFF_MAX_SECONDS must be at least RUN_RELEASE_BACKOFF_SECONDS.")
RUN_RELEASE_BATCH = envint("RUN_RELEASE_BATCH", "5", minimum=1)
RUN_RELEASE_LEASE_SECONDS = envint("RUN_RELEASE_LEASE_SECONDS", "900", minimum=1)
# After a cancel, how long the training process gets to stop at its next step before it is killed.
RUN_CANCEL_GRACE_SECONDS = envint("RUN_CANCEL_GRACE_SECONDS", "30", minimum=0)
# Runs drawn on one compare page; a page asked for more shows these and links to pages of the rest.
COMPARE_MAX_RUNS = envint("COMPARE_MAX_RUNS", "1000", minimum=1)
# Log lines kept per run in the database (the full log stays in the run directory).
RUN_LOG_MAX_LINES = envint("RUN_LOG_MAX_LINES", "5000", minimum=10)
# Platform runs one person, and one project, may have queued or running at once (sweep trials
# included); the next is refused until one ends. Platform admins are not limited (their runs still
# count in their project's total).
RUN_QUOTA_PER_PERSON = envint("RUN_QUOTA_PER_PERSON", "20", minimum=1)
RUN_QUOTA_PER_PROJECT = envint("RUN_QUOTA_PER_PROJECT", "50", minimum=1)
# Checking a run before it is queued runs its registry code in a child process with these limits
# (seconds of wall-clock and CPU time; megabytes of memory beyond the warm checker's).
RUN_CHECK_TIMEOUT_SECONDS = envint("RUN_CHECK_TIMEOUT_SECONDS", "20", minimum=1)
RUN_CHECK_MEMORY_MB = envint("RUN_CHECK_MEMORY_MB", "2048", minimum=256)

# The playground (webapp/playground): questions to a run's trained model, answered by a worker of
# the run's queue. Each bound holds for every person: a request waits at most QUEUE_SECONDS for a
# free worker, generates for at most REPLY_SECONDS, and asks for at most MAX_NEW_TOKENS tokens
# after a prompt of at most MAX_PROMPT_TOKENS; one person has at most MAX_PENDING requests waiting.
PLAYGROUND_QUEUE_SECONDS = envint("PLAYGROUND_QUEUE_SECONDS", "120", minimum=1)
PLAYGROUND_REPLY_SECONDS = envint("PLAYGROUND_REPLY_SECONDS", "120", minimum=5)
PLAYGROUND_MAX_NEW_TOKENS = envint("PLAYGROUND_MAX_NEW_TOKENS", "512", minimum=1)
PLAYGROUND_MAX_PROMPT_TOKENS = envint("PLAYGROUND_MAX_PROMPT_TOKENS", "4096", minimum=16)
PLAYGROUND_MAX_PENDING = envint("PLAYGROUND_MAX_PENDING", "2", minimum=1)
PLAYGROUND_CPU_THREADS = envint("PLAYGROUND_CPU_THREADS", "1", minimum=1)
# The queue every question goes to, served by a worker of its own so that the playground answers
# while runs train (`manage.py platform` starts one and sets this); empty: the run backend's queue,
# where a question waits behind the runs that hold its slots.
PLAYGROUND_QUEUE = os.environ.get("PLAYGROUND_QUEUE", "").strip()
# Evaluations of checkpoints (webapp.checkpoints): the most rows of a dataset one scores, and how long
# its worker's process may take before it is stopped.
EVALUATION_MAX_TASKS = envint("EVALUATION_MAX_TASKS", "500", minimum=1)
EVALUATION_SECONDS = envint("EVALUATION_SECONDS", "3600", minimum=10)

# Alerts (webapp/integrations): the outbox's retries, the sender's queue, links in messages.
ALERT_MAX_ATTEMPTS = envint("ALERT_MAX_ATTEMPTS", "8", minimum=1)
ALERT_RETRY_BASE_SECONDS = envint("ALERT_RETRY_BASE_SECONDS", "10", minimum=1)
ALERT_RETRY_MAX_SECONDS = envint("ALERT_RETRY_MAX_SECONDS", "3600", minimum=1)
ALERT_QUEUE = os.environ.get("ALERT_QUEUE", "cpu")
# The egress guard (training/egress.py) refuses outbound URLs a person chose (webhooks, tracking
# servers) at loopback, private, link-local and other non-public addresses, except these hosts:
# comma-separated "host" or "host:port" entries, e.g. "mlflow.internal,10.0.0.5:5000".
EGRESS_ALLOWED_HOSTS = envhosts("EGRESS_ALLOWED_HOSTS")
# `make run` (python manage.py platform): the address it serves and the administrator login it makes
# (created, or its password reset to this one, at each start); its --host, --port, --username and
# --password flags win over these.
PLATFORM_HOST = envtext("PLATFORM_HOST", "127.0.0.1")
PLATFORM_PORT = envint("PLATFORM_PORT", "8000", minimum=1, maximum=65535)
PLATFORM_DEMO_USERNAME = envtext("PLATFORM_DEMO_USERNAME", "demo")
PLATFORM_DEMO_PASSWORD = envtext("PLATFORM_DEMO_PASSWORD", "demo")
# The address in links the platform sends (alert messages); `manage.py platform` sets it for its web
# server and worker to the address it serves, unless it is set.
PLATFORM_URL = os.environ.get("PLATFORM_URL", f"http://127.0.0.1:{PLATFORM_PORT}")
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = envint("EMAIL_PORT", "25", minimum=1)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "agent-trainer@localhost")

# The REST API (webapp/api): token auth for scripts and the library, session auth (with CSRF) for browsers.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "webapp.api.auth.ExpiringTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": [
        "webapp.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "webapp.api.parsers.capped_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent training platform API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Modules imported before any AgentTrainer is built, in the web process and in training processes:
# they register datasets, rewards and backends by name (the examples register frozenlake, copy, countdown).
TRAINING_PLUGINS = envlist("TRAINING_PLUGINS", "examples")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO").upper()},
}


# -- Hardening (docs/security.md) ------------------------------------------------------------------
# Login lockout (django-axes), on the login page, the admin's and /api/token/ alike: after
# LOGIN_FAILURE_LIMIT wrong passwords for one account from one address, that pair is refused
# (429) for LOGIN_LOCKOUT_MINUTES; a successful login resets the count.
AXES_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", "5", minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=envint("LOGIN_LOCKOUT_MINUTES", "15", minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# API tokens (webapp/api/auth.py) expire after this long and end when their user logs out.
API_TOKEN_TTL_SECONDS = envint("API_TOKEN_TTL_SECONDS", str(30 * 24 * 3600), minimum=60)

# Cookies only over HTTPS (browsers also send them to http://localhost) and out of scripts' reach.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = envbool("SECURE_COOKIES", "false" if DEBUG else "true")
SESSION_COOKIE_HTTPONLY = CSRF_COOKIE_HTTPONLY = True
# HSTS is sent on HTTPS responses only; redirecting http to https is for a deployment with TLS
# (SECURE_SSL_REDIRECT=1), BEHIND_HTTPS_PROXY=1 when a proxy terminates it (X-Forwarded-Proto).
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", "0" if DEBUG else "31536000", minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", "true")
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", "true")
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "false")
if envbool("BEHIND_HTTPS_PROXY", "false"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
X_FRAME_OPTIONS = "DENY"

# Content-Security-Policy (django-csp): scripts from this site or inline with the page's nonce
# ({{ request.csp_nonce }}), no inline event handlers; styles inline too (Plotly writes them).
from csp.constants import NONCE, NONE, SELF  # noqa: E402

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF, "data:", "blob:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "worker-src": [SELF, "blob:"],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

# Run files and uploads on an artifact store (docs/fleet.md).
def envartifacts(name: str) -> str:
    """$ARTIFACTS_URL: empty (each run's files stay in its folder under RUNS_DIR, where it trained: one
    machine), a shared folder (an absolute path or file:///path) or ``s3://bucket/prefix`` (any
    S3-compatible store; credentials from the AWS variables, AWS_ENDPOINT_URL for one not on AWS)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return ""
    if value.startswith(("s3://", "file:///")) and len(value.split("://", 1)[1].strip("/")) > 0:
        return value
    if value.startswith("/"):
        return value
    raise ImproperlyConfigured(f"{name} must be an absolute folder, file:///folder or s3://bucket/prefix, not {value!r}.")


# Where run files (checkpoints, final models, metrics, episodes, logs) and uploaded datasets are
# kept for every machine to read (workers train in a scratch folder under RUNS_DIR and copy them there).
ARTIFACTS_URL = envartifacts("ARTIFACTS_URL")
# How long a finished run waits for the store to take its final model before it fails (an outage).
ARTIFACTS_FINISH_SECONDS = envint("ARTIFACTS_FINISH_SECONDS", "3600", minimum=1)
# The longest wait between two tries of an upload while the store is unreachable.
ARTIFACTS_RETRY_MAX_SECONDS = envint("ARTIFACTS_RETRY_MAX_SECONDS", "30", minimum=1)
# Checkpoints waiting to be stored, at most; beyond it the oldest waiting one is skipped for the newer.
ARTIFACTS_MAX_PENDING = envint("ARTIFACTS_MAX_PENDING", "8", minimum=1)
# Checkpoints each run keeps in the store, the newest (a project's own number comes first); 0: all.
ARTIFACTS_KEEP_CHECKPOINTS = envint("ARTIFACTS_KEEP_CHECKPOINTS", "0", minimum=0)
# Downloads of stored files redirect to a presigned link (the bytes go from the store to the browser)
# lasting this long; off when browsers cannot reach the store's endpoint (then they stream through here).
ARTIFACTS_PRESIGN = envbool("ARTIFACTS_PRESIGN", "true")
ARTIFACTS_PRESIGN_SECONDS = envint("ARTIFACTS_PRESIGN_SECONDS", "300", minimum=10)
if ARTIFACTS_URL:  # uploaded files (datasets) go to the store too, readable by every worker
    STORAGES = {
        "default": {"BACKEND": "webapp.runs.artifacts.ArtifactStorage"},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
