"""Data flows one way: ``workers`` imports the web app's models, the web app never imports ``workers``
(a queued run is an outbox row the workers' dispatcher sends; the web side sends nothing itself)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_webapp_module_imports_workers_even_inside_a_function():
    offenders = {
        str(path.relative_to(ROOT)): sorted(name for name in _imported_modules(path) if name.split(".")[0] == "workers")
        for path in (ROOT / "webapp").rglob("*.py")
    }
    offenders = {path: names for path, names in offenders.items() if names}
    assert not offenders, f"the web app imports workers: {offenders}"
    assert _imported_modules(ROOT / "workers" / "execute.py") & {"webapp.runs.models"}, "the check reads real imports"


def test_the_running_web_app_has_not_loaded_workers():
    code = (
        "import os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'webapp.settings');"
        "import django; django.setup();"
        "import webapp.asgi, webapp.urls, webapp.health, webapp.fleet.control, webapp.runs.forms, webapp.api.views;"
        "from django.urls import get_resolver; get_resolver().url_patterns;"
        "print(sorted(m for m in sys.modules if m == 'workers' or m.startswith('workers.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
