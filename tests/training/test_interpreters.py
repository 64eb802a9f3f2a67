"""A backend's own interpreter is asked, in a short isolated subprocess, whether it imports what
the backend's training process needs. Nothing is a stand-in: real interpreters (this one, which
has no ms-swift, and ``.venv-swift`` where ``make swift-env`` built it)."""

import sys
from pathlib import Path

import pytest

from training.isolation import interpreters
from training.backends.swift.backend import CHILD_MODULES, CHILD_PACKAGES, DEFAULT_PYTHON, environment_problem

THIS_PYTHON = Path(sys.executable)


@pytest.fixture(autouse=True)
def fresh_cache():
    interpreters.forget()
    yield
    interpreters.forget()


def test_an_interpreter_that_imports_the_modules_is_fine():
    assert interpreters.import_problem(THIS_PYTHON, ("json", "training.isolation.interpreters")) is None


def test_an_interpreter_without_the_package_names_the_import_error():
    problem = environment_problem(THIS_PYTHON)  # the platform's environment has no ms-swift
    assert problem.startswith(f"its environment {THIS_PYTHON} cannot import {', '.join(CHILD_MODULES + CHILD_PACKAGES)}: ")
    assert "ModuleNotFoundError: No module named 'swift'" in problem and "make swift-env" in problem


@pytest.mark.skipif(not DEFAULT_PYTHON.is_file(), reason="no .venv-swift here; `make swift-env` builds it (make test does)")
def test_the_swift_environment_imports_ms_swift():
    assert environment_problem(DEFAULT_PYTHON) is None


def test_a_package_that_is_only_looked_up_is_named_when_missing():
    problem = interpreters.import_problem(THIS_PYTHON, ("json",), present=("torch", "no_such_package_here"))
    assert problem.endswith("ModuleNotFoundError: No module named 'no_such_package_here'")
    assert interpreters.import_problem(THIS_PYTHON, ("json",), present=("torch",)) is None


def test_a_missing_interpreter_is_named():
    assert interpreters.import_problem("/nowhere/python", ("json",)) == "its environment /nowhere/python does not exist"


def test_files_where_the_caller_runs_are_never_imported(tmp_path, monkeypatch):
    """The web process's working directory and PYTHONPATH stay out of the check: a swift.py left
    there is not run (isolated mode), and ms-swift is still reported missing."""
    marker = tmp_path / "ran"
    (tmp_path / "swift.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    problem = interpreters.import_problem(THIS_PYTHON, ("swift",))
    assert "No module named 'swift'" in problem
    assert not marker.exists()


def counted_asks(monkeypatch) -> tuple[list, list[float]]:
    """The subprocesses import_problem starts (each still runs), and a clock the test moves."""
    calls = []
    real_run = interpreters.subprocess.run
    monkeypatch.setattr(interpreters.subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    now = [1000.0]
    monkeypatch.setattr(interpreters.time, "monotonic", lambda: now[0])
    return calls, now


def test_answers_are_kept_for_a_while_then_asked_again(monkeypatch):
    """An interpreter outside a virtual environment: nothing tells when its packages change."""
    calls, now = counted_asks(monkeypatch)
    base = Path(sys._base_executable)
    assert interpreters.import_problem(base, ("json",)) is None
    assert interpreters.import_problem(base, ("json",)) is None
    assert len(calls) == 1
    now[0] += interpreters.CACHE_SECONDS + 1
    assert interpreters.import_problem(base, ("json",)) is None
    assert len(calls) == 2


def test_a_virtual_environments_answer_is_kept_until_its_packages_change(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    packages = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    packages.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys._base_executable).parent}\ninclude-system-site-packages = false\n")
    (venv / "bin" / "python").symlink_to(sys._base_executable)
    python = venv / "bin" / "python"
    calls, now = counted_asks(monkeypatch)

    assert "No module named 'tiny_pkg'" in interpreters.import_problem(python, ("tiny_pkg",))
    now[0] += interpreters.CACHE_SECONDS + 1
    assert "No module named 'tiny_pkg'" in interpreters.import_problem(python, ("tiny_pkg",))
    assert len(calls) == 1  # the environment as it was: the answer stands
    (packages / "tiny_pkg.py").write_text("")  # a package installed
    assert interpreters.import_problem(python, ("tiny_pkg",)) is None
    assert len(calls) == 2
    now[0] += interpreters.STABLE_SECONDS + 1
    assert interpreters.import_problem(python, ("tiny_pkg",)) is None
    assert len(calls) == 3  # asked again once it is old, changed or not


def test_an_interpreter_that_hangs_is_cut_off(tmp_path, monkeypatch):
    hanging = tmp_path / "python"
    hanging.write_text("#!/bin/sh\nexec sleep 30\n")
    hanging.chmod(0o755)
    monkeypatch.setattr(interpreters, "TIMEOUT_SECONDS", 0.5)
    assert interpreters.import_problem(hanging, ("swift",)) == f"its environment {hanging} did not import swift within 0.5 s"
