"""Every exception type of the library, on the ground floor so that any floor can raise or catch
any of them without importing the floor that raises it.
"""

from __future__ import annotations

from typing import Any

from training.types import TerminationReason


# --- raised in config.schema ---

class ConfigError(ValueError):
    """A configuration value or key is wrong. ``key`` names the dotted key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class Problems(ValueError):
    """Several independent problems found in one check, each a ``ValueError`` in ``problems`` (a
    ``ConfigError`` names its key); its text is theirs, one a line."""

    def __init__(self, problems: list[ValueError]) -> None:
        super().__init__("\n".join(str(problem) for problem in problems))
        self.problems = list(problems)


# --- raised in config.secrets ---

class MissingSecret(ValueError):
    """A referenced secret is not set where the run trains."""


# --- raised in isolation.jail ---

class JailUnavailable(RuntimeError):
    """This machine cannot jail untrusted code (no bubblewrap, or no namespaces)."""


class ProgramsRefused(RuntimeError):
    """This process refuses to start programs (``refuse_new_programs``): what needs one, such as an
    environment's MCP server, is built when the run starts, not while the run is checked."""


# --- raised in isolation.egress ---

class EgressRefused(Exception):
    """The guard refused a destination. The message is ours (no remote's text): safe to show."""


# --- raised in rollouts.generation ---

class ModelCallError(RuntimeError):
    """The model itself failed (not the agent or the environment). It stops the rollout instead of
    being counted as an error episode, because retrying episodes cannot fix a broken model."""


# --- raised in rollouts.outcomes ---

class TrainingFailed(RuntimeError):
    """A run that must not count as a success.

    ``summary`` names the cause in a few lines; ``user_traceback`` is the traceback of the user's
    code behind it (empty when there is none). ``str()`` gives both.
    """

    def __init__(self, summary: str, user_traceback: str = "") -> None:
        self.summary = summary
        self.user_traceback = user_traceback.rstrip()
        super().__init__(f"{summary}\n\n{self.user_traceback}" if self.user_traceback else summary)


class TooManyEpisodeErrors(TrainingFailed):
    """More than ``trainer.max_episode_error_rate`` of one step's episodes ended with an error."""


# --- raised in rollouts.chat_endpoint ---

class RequestError(ValueError):
    """A request the endpoint cannot serve; answered with HTTP 400 and this message."""


# --- raised in algorithms.episode_rows ---

class MultiSequenceEpisode(RuntimeError):
    """An episode of several sequences on a backend that trains one per episode."""


# --- raised in agents.workflow ---

class TerminationEvent(Exception):
    """Raised inside ``run`` to end the episode early with ``reason`` (what was committed is kept)."""

    def __init__(self, reason: TerminationReason = TerminationReason.UNKNOWN) -> None:
        super().__init__(f"Terminated: {reason}")
        self.reason = reason


# --- raised in agents.sdk.run_func ---

class NoModelCall(RuntimeError):
    """The function returned without calling the model: the episode has nothing to train on."""


# --- raised in tracking.trackers ---

class TrackerError(RuntimeError):
    """A tracker could not send; the message is ours (no server's text), safe to show."""


# --- raised in backends.processor ---

class RunSuperseded(RuntimeError):
    """Another process owns the run now (``AgentTrainer(may_write=...)`` said so): this one writes
    nothing more of it."""


class OwnerUnknown(RuntimeError):
    """Whether this process still owns the run cannot be told now (the platform's database is
    away): what it would publish waits."""


class DiskFull(OSError):
    """A file of the run (a checkpoint, the final model) did not fit on its disk."""


# --- raised in backends.tinker_protocol.service ---

class RemoteCallError(RuntimeError):
    """A call to the remote training service failed; the message names the service, call and step."""


class Terminated(BaseException):
    """SIGTERM arrived (a supervisor stopping this process): unwind so remote resources are released."""


# --- raised in platform.artifacts ---

class ArtifactStoreError(RuntimeError):
    """The store refused or could not be reached; the message names the key and the cause."""


# --- raised in platform.reporter ---

class PlatformError(RuntimeError):
    """The platform answered with an error (``status`` is the HTTP status, 0 when unreachable)."""

    def __init__(self, message: str, status: int = 0, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


# --- raised in compat.rllm.mcp_env ---

class MCPServerError(RuntimeError):
    """An MCP server that could not be started, is not running, or went away."""


class MCPToolError(RuntimeError):
    """A tool call that failed: the tool reported an error, or did not answer in time."""


# --- raised in agents.base ---

class MissingField(ValueError):
    """An environment's ``from_dict`` asked for a key that neither the dataset row nor ``env_args`` has."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
