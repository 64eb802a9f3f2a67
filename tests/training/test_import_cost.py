"""What ``import training`` costs a process that needs only a few of its names (a Celery worker or the
web process importing the egress guard, the CLI before its run is built): none of the heavy libraries.
They load where they are used: HF datasets where a run loads data, torch where a model is built."""

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "datasets", "pandas", "trl", "openai")


def test_import_training_loads_no_heavy_library_until_it_is_used():
    code = (f"import sys, training\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
            "training.DatasetRegistry\nprint('datasets' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.splitlines() == ["[]", "True"], done.stderr[-2000:]
