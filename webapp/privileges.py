"""The platform's processes never run as root.

Every launcher (``manage.py platform``, the web server, a Celery worker) calls ``drop_root()``
first. Started as root, it becomes ``PLATFORM_USER`` (default ``agenttrainer``; ``make run``
creates it, the image runs as its own user) after handing it ``VAR_DIR`` (the database, the
secret key, run folders); where that user does not exist it refuses to start, naming the fix.
A process started by an unprivileged user goes on as it is.

``PLATFORM_ALLOW_ROOT=1`` lets a throwaway machine's test suite run its servers as root (the
tests' own folders belong to root); it is never set in the image or by ``make run``.
"""

from __future__ import annotations

import logging
import os
import pwd
from pathlib import Path

logger = logging.getLogger(__name__)
DEFAULT_USER = "agenttrainer"


class RootRefused(SystemExit):
    """Started as root with no unprivileged user to become."""


def drop_root(var_dir: Path | str) -> None:
    """Become the platform's unprivileged user when started as root (see the module doc)."""
    if os.geteuid() != 0:
        return
    if os.environ.get("PLATFORM_ALLOW_ROOT") == "1":
        logger.warning("running as root because PLATFORM_ALLOW_ROOT=1: only for a throwaway test machine")
        return
    name = os.environ.get("PLATFORM_USER", "").strip() or DEFAULT_USER
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise RootRefused(
            f"The platform does not run as root. Start it as an unprivileged user, or create the user {name!r} "
            f"for it to become (`make run` does: scripts/service_user.sh; PLATFORM_USER names another).") from None
    if user.pw_uid == 0:
        raise RootRefused(f"PLATFORM_USER={name!r} is root; name an unprivileged user.")
    _hand_over(Path(var_dir), user.pw_uid, user.pw_gid)
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    os.environ.update(HOME=user.pw_dir if os.path.isdir(user.pw_dir) else str(var_dir), USER=name, LOGNAME=name)
    logger.info("running as %s (uid %s), not root", name, user.pw_uid)


def _hand_over(folder: Path, uid: int, gid: int) -> None:
    """``folder`` and what root left in it, owned by the platform's user."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in [folder, *folder.rglob("*")]:
        try:
            if path.lstat().st_uid == 0:
                os.chown(path, uid, gid, follow_symlinks=False)
        except FileNotFoundError:  # removed meanwhile (a finished run's scratch files)
            continue
