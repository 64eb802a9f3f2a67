"""Report a run trained anywhere (a notebook, a cluster job) to the web platform over its REST API.

Standard library only: no Django, no ``requests``. ``PlatformClient`` speaks the API (token
authentication); ``RemoteSink`` is a ``MetricSink`` that creates an *external* run on the platform
on first use, sends metric points and the ``training`` logger's lines in batches from a background
thread (training never waits on the network), heartbeats, and marks the run finished on ``close``::

    sink = RemoteSink("https://platform.example", token="...", name="notebook try", tags=["lake"])
    AgentTrainer(..., sinks=[sink], should_stop=sink.should_stop).train()
    sink.close()

The run shows up live on the platform like one it started; cancelling it there makes
``should_stop()`` true at the next heartbeat.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any
from training.errors import PlatformError

logger = logging.getLogger("training")

URL_ENV, TOKEN_ENV = "PLATFORM_URL", "PLATFORM_TOKEN"


def credentials_path() -> Path:
    """Where ``agent-trainer-platform login`` keeps the address and token: $AGENT_TRAINER_CREDENTIALS,
    else ``platform.json`` in $XDG_CONFIG_HOME/agent-trainer (``~/.config/agent-trainer``)."""
    explicit = os.environ.get("AGENT_TRAINER_CREDENTIALS", "").strip()
    if explicit:
        return Path(explicit)
    config_home = os.environ.get("XDG_CONFIG_HOME", "").strip() or Path.home() / ".config"
    return Path(config_home) / "agent-trainer" / "platform.json"


def stored_credentials() -> dict[str, str]:
    """What ``login`` saved (``{"url", "token"}``), or ``{}``."""
    try:
        data = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return {}
    return {key: str(data[key]) for key in ("url", "token") if data.get(key)}


def store_credentials(url: str, token: str) -> Path:
    """Save the address and token, readable by this user only."""
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump({"url": url.rstrip("/"), "token": token}, file)
    os.chmod(path, 0o600)  # an older file keeps its mode through O_CREAT
    return path


def obtain_token(url: str, username: str, password: str, timeout: float = 30.0) -> str:
    """Trade a username and password for the user's API token (``POST /api/token/``)."""
    client = PlatformClient(url, token="-", timeout=timeout)
    try:
        return client.request("POST", "token/", {"username": username, "password": password}, authenticate=False)["token"]
    except PlatformError as exc:
        if exc.status == 400:
            raise PlatformError("The platform refused that username and password.", 400, exc.detail) from None
        raise


def _sentence(detail: Any) -> str:
    """A DRF error body as plain text: ``field: message`` pairs, not a Python repr."""
    if isinstance(detail, dict):
        if set(detail) == {"detail"}:
            return _sentence(detail["detail"])
        return " ".join(
            (f"{_sentence(value)}" if key in ("non_field_errors", "detail") else f"{key}: {_sentence(value)}")
            for key, value in detail.items()
        )
    if isinstance(detail, list):
        return " ".join(_sentence(item) for item in detail)
    text = str(detail).strip()
    return text if text.endswith((".", "?", "!", ")")) or not text else text + "."


class PlatformClient:
    """The platform's REST API. ``url`` and ``token`` default to $PLATFORM_URL and $PLATFORM_TOKEN,
    then to what ``agent-trainer-platform login`` stored."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        stored = stored_credentials() if not (url and token) else {}
        url = url or os.environ.get(URL_ENV, "") or stored.get("url", "")
        if token is None:
            token = os.environ.get(TOKEN_ENV, "") or stored.get("token", "")
        if not url:
            raise ValueError(f"url: give the platform's address (or set ${URL_ENV}), e.g. http://127.0.0.1:8000.")
        if not token:
            raise ValueError(f"token: give an API token (or set ${TOKEN_ENV}); `agent-trainer-platform login` gets and stores one.")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
                authenticate: bool = True) -> Any:
        query = {k: v for k, v in (params or {}).items() if v not in (None, "")}
        address = f"{self.url}/api/{path.lstrip('/')}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(address, data=data, method=method, headers={
            **({"Authorization": f"Token {self.token}"} if authenticate else {}), "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {}),
        })
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                detail = json.loads(raw)
            except ValueError:
                detail = raw.decode(errors="replace")[:500]
            raise PlatformError(f"{method} {path}: the platform answered HTTP {exc.code}: {_sentence(detail)}", exc.code, detail) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            reason = getattr(reason, "strerror", None) or str(reason)
            raise PlatformError(f"{method} {path}: cannot reach {self.url} ({reason}). Is the platform running there?") from None
        return json.loads(raw) if raw else None

    # -- runs ---------------------------------------------------------------------------------
    def create_run(self, **fields: Any) -> dict:
        """``kind="platform"`` (queued on the platform's workers) or ``kind="external"``; see the API docs."""
        return self.request("POST", "runs/", fields)

    def fork_run(self, run_id: int, step: int, **fields: Any) -> dict:
        """A new run from run ``run_id``'s stored checkpoint of ``step``, its choices and config changed
        where ``fields`` say (``overrides``, ``agent``, ``dataset``, ``reward``, ``project``, ...)."""
        return self.request("POST", f"runs/{run_id}/fork/", {"step": step, **fields})

    def list_runs(self, **filters: Any) -> list[dict]:
        return self.request("GET", "runs/", params={"limit": 100, **filters})["results"]

    def get_run(self, run_id: int) -> dict:
        return self.request("GET", f"runs/{run_id}/")

    def cancel_run(self, run_id: int) -> dict:
        return self.request("POST", f"runs/{run_id}/cancel/")

    def metrics_after(self, run_id: int, after: int = -1) -> dict:
        return self.request("GET", f"runs/{run_id}/metrics/", params={"after": after})

    def logs_after(self, run_id: int, after: int = 0) -> list[dict]:
        return self.request("GET", f"runs/{run_id}/logs/", params={"after": after})

    # -- reporting an external run --------------------------------------------------------------
    def send_metrics(self, run_id: int, steps: list[dict]) -> None:
        self.request("POST", f"runs/{run_id}/metrics/", {"steps": steps})

    def send_logs(self, run_id: int, lines: list[dict]) -> None:
        self.request("POST", f"runs/{run_id}/logs/", {"lines": lines})

    def heartbeat(self, run_id: int) -> dict:
        return self.request("POST", f"runs/{run_id}/heartbeat/")

    def finish(self, run_id: int, status: str, error: str = "") -> dict:
        return self.request("POST", f"runs/{run_id}/finish/", {"status": status, "error": error})


class _LineHandler(logging.Handler):
    def __init__(self, sink: "RemoteSink") -> None:
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.log_line(record.levelname, record.getMessage())
        except Exception:
            self.handleError(record)


class RemoteSink:
    """A ``MetricSink`` that reports to the platform as an external run.

    ``run_id`` reports into an existing external run instead of creating one. ``capture_logger``
    (default ``"training"``) has its lines sent as the run's log; None sends none. Network errors
    are logged and retried at the next flush; nothing raises into the training loop.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        name: str = "",
        project: int | None = None,
        visibility: str = "private",
        tags: list[str] | tuple[str, ...] = (),
        notes: str = "",
        config: dict[str, Any] | None = None,
        model: str = "",
        run_id: int | None = None,
        flush_seconds: float = 2.0,
        heartbeat_seconds: float = 20.0,
        capture_logger: str | None = "training",
        client: PlatformClient | None = None,
    ) -> None:
        if flush_seconds <= 0:
            raise ValueError(f"flush_seconds must be positive, not {flush_seconds}.")
        self.client = client or PlatformClient(url, token)
        self.run_fields = {
            "kind": "external", "name": name, "project": project, "visibility": visibility, "tags": list(tags),
            "notes": notes, "overrides": dict(config or {}), "model": model,
        }
        self.run_id = run_id
        self.flush_seconds = flush_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.cancel_requested = False
        self._steps: list[dict] = []
        self._lines: list[dict] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._outcome: tuple[str, str] | None = None
        self._since_heartbeat = 0.0
        self._thread = threading.Thread(target=self._loop, name="remote-sink", daemon=True)
        self._handler = _LineHandler(self) if capture_logger else None
        self._logger = logging.getLogger(capture_logger) if capture_logger else None

    # -- the run --------------------------------------------------------------------------------
    def start(self) -> int:
        """Create the run now (otherwise the first report does). Returns its id."""
        with self._send_lock:
            if self.run_id is None:
                self.run_id = int(self.client.create_run(**self.run_fields)["id"])
        if not self._thread.is_alive() and not self._closed:
            if self._handler is not None:
                self._logger.addHandler(self._handler)
            self._thread.start()
        return self.run_id

    @property
    def url(self) -> str | None:
        return f"{self.client.url}/runs/{self.run_id}/" if self.run_id else None

    def should_stop(self) -> bool:
        """True once someone cancelled the run on the platform (pass as ``AgentTrainer(should_stop=)``)."""
        return self.cancel_requested

    # -- MetricSink -----------------------------------------------------------------------------
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (float(v) if math.isfinite(v) else None) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if clean:
            self._ensure_started()
            with self._lock:
                self._steps.append({"step": int(step), "metrics": clean})

    def log_episodes(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass  # episodes stay with the caller (JsonlSink keeps them); the platform's API takes metrics and logs

    def log_line(self, level: str, message: str) -> None:
        """Add a line to the run's log (the captured logger's records come here)."""
        with self._lock:
            self._lines.append({"level": level if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "INFO",
                                "message": message.replace("\x00", "")})

    def log_outcome(self, status: str, error: str = "") -> None:
        """How the run ended, when it raised: the backend tells its sinks before closing them
        (``MultiSink.__exit__``), and ``close`` then records this instead of ``succeeded``."""
        self._outcome = (status, error)

    def close(self, status: str | None = None, error: str = "") -> None:
        """Send what is buffered and record the run's end: ``status`` when given, else what
        ``log_outcome`` said, else ``succeeded`` (``cancelled`` if it was cancelled meanwhile)."""
        if status is None:
            status, error = self._outcome or ("succeeded", error)
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        if self._handler is not None:
            self._logger.removeHandler(self._handler)
        try:
            if self.run_id is None:
                if not (self._steps or self._lines):
                    return  # nothing was ever reported: no run to finish
                self.run_id = int(self.client.create_run(**self.run_fields)["id"])
        except PlatformError as exc:
            logger.warning("could not create the platform run; its reports are lost: %s", exc)
            return
        self.flush()
        if self.cancel_requested and status == "succeeded":
            status = "cancelled"
        try:
            self.client.finish(self.run_id, status, error)
        except PlatformError as exc:
            logger.warning("could not mark platform run %s %s: %s", self.run_id, status, exc)

    def __enter__(self) -> "RemoteSink":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close("failed" if exc else "succeeded", f"{exc_type.__name__}: {exc}" if exc else "")

    # -- sending ----------------------------------------------------------------------------------
    def flush(self) -> None:
        """Send buffered points and lines now (kept for the next try when the platform is unreachable)."""
        if self.run_id is None:
            return
        with self._send_lock:
            with self._lock:
                steps, self._steps = self._steps, []
                lines, self._lines = self._lines, []
            try:
                if steps:
                    self.client.send_metrics(self.run_id, steps)
                    steps = []
                if lines:
                    self.client.send_logs(self.run_id, lines)
                    lines = []
            except PlatformError as exc:
                if 400 <= exc.status < 500 and exc.status not in (408, 429):
                    logger.warning("the platform refused reports of run %s (dropped): %s", self.run_id, exc)
                    return
                logger.warning("reporting run %s failed (retrying): %s", self.run_id, exc)
                with self._lock:
                    self._steps[:0], self._lines[:0] = steps, lines

    def _ensure_started(self) -> None:
        if (self.run_id is None or not self._thread.is_alive()) and not self._closed:
            try:
                self.start()
            except PlatformError as exc:  # the platform is down: keep the points, try again at the next step
                logger.warning("could not create the platform run (will retry): %s", exc)

    def _heartbeat(self) -> None:
        try:
            answer = self.client.heartbeat(self.run_id)
        except PlatformError as exc:
            logger.warning("heartbeat of run %s failed: %s", self.run_id, exc)
            return
        if answer.get("cancel_requested") and not self.cancel_requested:
            self.cancel_requested = True
            logger.info("run %s was cancelled on the platform; stopping at the next step", self.run_id)

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_seconds):
            self.flush()
            self._since_heartbeat += self.flush_seconds
            if self._since_heartbeat >= self.heartbeat_seconds:
                self._since_heartbeat = 0.0
                self._heartbeat()
