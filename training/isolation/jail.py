"""The one jail for every piece of untrusted code: a bubblewrap mount namespace, run as an
unprivileged user, with no network.

Model-written code (the ``python`` tool, the ``code`` reward) and the platform's check of a run
before it is queued (``training.platform.probe``) run inside it. The kernel draws the walls, not Python:

- **Files**: a mount namespace holding only what the caller names: the interpreter and its
  libraries read-only, and the folders the job needs (read-only or writable). Everything else on
  the machine -- other runs' folders, the platform's secret key, its database files, site-packages
  for writing -- does not exist in there. ``/proc`` is a new one showing only the jail's own
  processes; ``/dev`` holds only the harmless devices; ``/tmp`` is an empty tmpfs.
- **User**: uid and gid 65534 (``nobody``), no supplementary groups, no capabilities, and
  ``no_new_privs``. Started by root, bubblewrap sets the mounts up with root's rights and
  ``setpriv`` drops to that uid before the first untrusted instruction, so the jailed code is a
  real unprivileged user on the machine; started by an unprivileged user, bubblewrap uses a user
  namespace and the code runs as that user's uid outside it.
- **Network**: a network namespace of its own, with only a loopback that reaches nothing outside.
- **Environment**: exactly the variables the caller gives (``--clearenv``): nothing is inherited.
- **Lifetime**: a pid namespace, so killing its first process ends everything the jailed code
  started, and (for a program its caller waits for) ``--die-with-parent``.

Without bubblewrap or user namespaces there is no jail, and untrusted code does not run at all
(``JailUnavailable`` says why and how to fix it): a weaker fallback would be a wall with a door.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from training.errors import JailUnavailable, ProgramsRefused

JAIL_UID = JAIL_GID = 65534  # nobody
# The system's read-only part: programs, shared libraries. Not /etc, /home, /root, /var, /run, /srv.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")


_refusing_programs = False


@dataclass(frozen=True)
class Jail:
    """What one jailed program sees. Paths appear at the same place as on the host.

    ``read_only``: folders or files visible read-only (the interpreter's are always added).
    ``writable``: folders it may write (they must exist; when the caller is root they are handed
    to the jail's uid). ``env``: its whole environment. ``workdir``: where it starts.
    ``die_with_parent``: the jail is killed when the thread that started it ends (the kernel's
    parent-death signal follows the thread, not the process): right for a program the caller
    waits for, wrong for a server started from a passing thread, which ends on its own instead."""

    workdir: str
    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    die_with_parent: bool = True

    def command(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` in this jail (raises ``JailUnavailable``)."""
        return self._command(require(), argv)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` in this jail. bubblewrap itself gets an empty environment too: it is the
        jail's first process, and its own ``/proc/1/environ`` would otherwise show the caller's."""
        return subprocess.Popen(self.command(argv), env={"PATH": "/usr/bin:/bin"}, **kwargs)

    def _command(self, bwrap: str, argv: Sequence[str]) -> list[str]:
        root = os.geteuid() == 0
        args = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                "--new-session", "--clearenv", "--hostname", "jail"]
        if self.die_with_parent:
            args.append("--die-with-parent")
        if root:  # set the mounts up as root, then setpriv drops to the jail's uid (no user namespace)
            # (and enter a working folder that belongs to the jail's uid); setpriv's change of uid clears them all
            args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_DAC_READ_SEARCH"]
        else:
            args += ["--unshare-user", "--uid", str(JAIL_UID), "--gid", str(JAIL_GID), "--disable-userns"]
        for name, value in self.env.items():
            args += ["--setenv", name, value]
        args += _mounts(self.read_only, self.writable)
        args += ["--chdir", self.workdir]
        if root:
            for path in self.writable:
                _hand_to_jail(path)
            argv = ["setpriv", f"--reuid={JAIL_UID}", f"--regid={JAIL_GID}", "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=-all", "--", *argv]
        return [*args, "--", *argv]


# -- the seccomp filter ------------------------------------------------------------------------
# Inside the jail a process may still start programs that are in it (the interpreter itself).
# A seccomp filter, installed by the jailed process before it runs what it does not trust, refuses
# that too: no new program (execve, execveat), no new process (fork, vfork, clone without
# CLONE_THREAD), no namespace (unshare, setns), no socket; threads only where asked for (clone3's
# flags are out of a filter's sight, so it answers ENOSYS and the C library falls back to clone).

_ARCHES = {  # audit arch, and the numbers of: clone, clone3, fork, vfork, execve, execveat, socket, unshare, setns
    "x86_64": (0xC000003E, {"clone": 56, "clone3": 435, "others": (57, 58, 59, 322, 41, 272, 308)}),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435, "others": (281, 221, 198, 97, 268)}),
}
_CLONE_THREAD = 0x00010000


@functools.cache
def filter_program(threads: bool) -> bytes | None:
    """The filter's BPF program (``struct sock_filter`` entries), or None on an architecture it
    does not know. ``threads``: clone with CLONE_THREAD is allowed (a tokenizer's thread pool)."""
    import struct

    arch = _ARCHES.get(os.uname().machine)
    if arch is None:
        return None
    audit_arch, numbers = arch
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL, EPERM, ENOSYS = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38
    # (code, k, true-label, false-label); labels are resolved to relative jumps below
    program: list[tuple] = [
        (LD, 4, None, None), (JEQ, audit_arch, "arch-ok", "kill"),
        ("arch-ok",), (LD, 0, None, None),
        (JGE, 0x40000000, "eperm", "x64"),  # x86-64's x32 numbers reach the same calls: refused whole
        ("x64",), (JEQ, numbers["clone3"], "enosys" if threads else "eperm", "not-clone3"),
        ("not-clone3",), (JEQ, numbers["clone"], "clone" if threads else "eperm", "not-clone"),
        ("not-clone",),
    ]
    for index, number in enumerate(numbers["others"]):
        program += [(JEQ, number, "eperm", f"next-{index}"), (f"next-{index}",)]
    program += [(RET, ALLOW, None, None),
                ("clone",), (LD, 16, None, None), (JSET, _CLONE_THREAD, "allow", "eperm"),
                ("allow",), (RET, ALLOW, None, None),
                ("enosys",), (RET, ENOSYS, None, None),
                ("eperm",), (RET, EPERM, None, None),
                ("kill",), (RET, KILL, None, None)]
    labels, position = {}, 0
    for entry in program:
        if len(entry) == 1:
            labels[entry[0]] = position
        else:
            position += 1
    code, position = [], 0
    for entry in program:
        if len(entry) == 1:
            continue
        op, k, true, false = entry
        jt = labels[true] - position - 1 if true else 0
        jf = labels[false] - position - 1 if false else 0
        code.append(struct.pack("HBBI", op, jt, jf, k))
        position += 1
    return b"".join(code)


def install_filter(hex_program: str) -> bool:
    """Install a filter program (hex of ``filter_program``'s bytes) in this process: True when the
    kernel took it. Self-contained, so the sandbox's runner can carry its source: the jailed
    interpreter there cannot import this package."""
    import ctypes

    if not hex_program:
        return False
    code = bytes.fromhex(hex_program)
    buffer = ctypes.create_string_buffer(code, len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = Program(len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) == 0


def refuse_new_programs(threads: bool = True) -> bool:
    """Install the filter in this process (and every thread and child it makes from now on):
    True when the kernel took it."""
    global _refusing_programs
    program = filter_program(threads)
    _refusing_programs = install_filter(program.hex() if program else "")
    return _refusing_programs


def refusing_programs() -> bool:
    """Whether this process has refused itself new programs (a run check's child)."""
    return _refusing_programs


def interpreter() -> str:
    """This interpreter as a jail can start it: its folder's real path (a virtual environment reached
    through a symbolic link is mounted at its real place), its own name (a virtual environment's
    ``python`` is itself a link, and only through it is the environment's site-packages found)."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


def interpreter_paths() -> list[str]:
    """Where this interpreter and its installed packages live: the jailed Python needs them (read-only)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(path for name in ("stdlib", "platstdlib", "purelib", "platlib") if (path := sysconfig.get_path(name)))
    paths.update(p for p in sys.path if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p))
    return sorted(paths)


def unavailable_reason() -> str | None:
    """Why untrusted code cannot be jailed on this machine, or None when it can."""
    return _probe()


def require() -> str:
    """The bubblewrap executable, or ``JailUnavailable`` saying what to install."""
    reason = _probe()
    if reason is not None:
        raise JailUnavailable(reason)
    return shutil.which("bwrap")  # type: ignore[return-value]


@functools.cache
def _probe() -> str | None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return ("untrusted code runs only in a bubblewrap jail, and bubblewrap is not installed on this machine "
                "(Debian/Ubuntu: apt-get install bubblewrap)")
    try:
        trial = Jail(workdir="/")._command(bwrap, ["true"])
        done = subprocess.run(trial, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not be started ({exc})"
    if done.returncode != 0:
        return (f"bubblewrap cannot make a jail here ({done.stderr.strip()[:300] or f'exit {done.returncode}'}); "
                "it needs user namespaces, or root to start it (a container needs them allowed by its seccomp profile)")
    return None


def _mounts(read_only: Iterable[str], writable: Iterable[str]) -> list[str]:
    """bubblewrap's mount options: the system's programs and libraries, the interpreter's folders,
    then the caller's, each parent folder made traversable (mode 0755, not the host's: the host's
    /root may be 0700 while the interpreter installed under it is world-readable)."""
    args = ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    for path in SYSTEM_PATHS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    binds = {"/proc", "/dev", *SYSTEM_PATHS}  # mounted: what lies below them is already visible
    folders = {"/", "/tmp"}  # made empty: what lies below them needs a mount or a folder of its own
    wanted = [(os.path.realpath(p), "--ro-bind") for p in [*interpreter_paths(), *read_only]]
    wanted += [(os.path.realpath(p), "--bind") for p in writable]
    for path, option in sorted(wanted, key=lambda item: (item[0].count("/"), item[0])):
        if not os.path.exists(path) or path in binds or (option == "--ro-bind" and _inside(path, binds)):
            continue
        ancestors, parent = [], os.path.dirname(path)
        while parent not in folders and not _inside(parent, binds):
            ancestors.append(parent)
            parent = os.path.dirname(parent)
        for folder in reversed(ancestors):
            args += ["--perms", "0755", "--dir", folder]
            folders.add(folder)
        args += [option, path, path]
        binds.add(path)
    return args


def _inside(path: str, binds: set[str]) -> bool:
    return any(path == m or path.startswith(m + "/") for m in binds)


def _hand_to_jail(path: str) -> None:
    """A writable folder (and what is in it) owned by the jail's uid, so that uid can write there."""
    os.chown(path, JAIL_UID, JAIL_GID)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), JAIL_UID, JAIL_GID, follow_symlinks=False)
