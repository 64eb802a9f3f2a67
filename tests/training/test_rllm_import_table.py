"""docs/rllm.md's import table is a promise: each right-hand import works as written, and (as the
README says, "change each `from rllm.<module> import X` to `from training import X`") each name
imports from ``training`` too."""

import importlib
import re
from pathlib import Path

import pytest

import training

DOC = Path(__file__).resolve().parents[2] / "docs" / "rllm.md"
IMPORT = re.compile(r"`from (training(?:\.\w+)*) import ([^`]+)`")


def promised() -> list[tuple[str, str]]:
    """(module, name) for every name the table's right-hand column imports."""
    found = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `from rllm") and not line.startswith("| `import rllm"):
            continue
        right = line.split("|")[2]
        for module, names in IMPORT.findall(right):
            for name in names.split(","):
                name = name.split(" as ")[0].strip().strip("()")
                if re.fullmatch(r"[A-Za-z_]\w*", name):
                    found.append((module, name))
    return found


def test_the_table_promises_many_names():
    assert len(promised()) > 40  # the parser read the table, not an empty list


@pytest.mark.parametrize("module, name", promised())
def test_each_name_imports_from_its_module_and_from_training(module, name):
    assert hasattr(importlib.import_module(module), name), f"{module} has no {name}"
    assert getattr(training, name) is getattr(importlib.import_module(module), name), f"training.{name}"
