"""The one settings module. Every knob is an environment variable with a default that works on a
fresh laptop (SQLite, a file-system broker under var/, an in-process channel layer).

A bad value raises ImproperlyConfigured naming the variable.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

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


def envint(name: str, default: str, minimum: int | None = None) -> int:
    value = os.environ.get(name, default).strip()
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, not {value!r}.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {number}.")
    return number


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


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


DEBUG = envbool("DEBUG", "true")
SECRET_KEY = os.environ.get("SECRET_KEY", "").strip() or "dev-only-insecure-secret-key-change-me"
if not DEBUG and SECRET_KEY.startswith("dev-only-"):
    raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")

# Where runs write checkpoints and logs, and where the embedded broker keeps its messages.
VAR_DIR = Path(os.environ.get("PLATFORM_VAR_DIR", "").strip() or BASE_DIR / "var")
RUNS_DIR = VAR_DIR / "runs"

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
    "webapp.teams",
    "webapp.api",
    "webapp.fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 30  # workers and web write at once
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
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

# Redis, when given, carries both Celery messages and the Channels layer. Without it the platform
# runs with no server at all: Celery's messages go through files under var/broker (kombu's
# filesystem transport, shared by every process on this machine).
REDIS_URL = envredis("REDIS_URL")
BROKER_DIR = VAR_DIR / "broker"
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {"visibility_timeout": 7 * 24 * 3600}
    CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
    }
else:
    CELERY_BROKER_URL = "filesystem://"
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

CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a worker that dies mid-run does not lose the message silently
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # one run per worker process (one per GPU on GPU workers)
CELERY_TASK_DEFAULT_QUEUE = "cpu"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Run lifecycle.
RUN_HEARTBEAT_SECONDS = envint("RUN_HEARTBEAT_SECONDS", "5", minimum=1)
# A running run whose heartbeat is older than this is marked failed (its worker died).
RUN_STALE_SECONDS = envint("RUN_STALE_SECONDS", "120", minimum=10)
# After a cancel, how long the training process gets to stop at its next step before it is killed.
RUN_CANCEL_GRACE_SECONDS = envint("RUN_CANCEL_GRACE_SECONDS", "30", minimum=0)
# Log lines kept per run in the database (the full log stays in the run directory).
RUN_LOG_MAX_LINES = envint("RUN_LOG_MAX_LINES", "5000", minimum=10)

# The REST API (webapp/api): token auth for scripts and the library, session auth (with CSRF) for browsers.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent training platform API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
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
