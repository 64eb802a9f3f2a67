"""Where the test suite's time goes, per test file: the sum of pytest's per-test durations (setup,
call and teardown) from the output of a run with ``--durations=0``.

    PYTHONPATH=tests .venv/bin/python -m pytest -p platform_slots -n 2 --dist worksteal --durations=0 tests > before.txt
    python bench/suite_time.py before.txt [after.txt] [--top 25]

Prints each file's seconds (and, given two runs, both and their difference), slowest first, as
JSON. Durations are wall time inside each test process: on a shared machine they swing with the
neighbours' work, so compare runs made under the same load, or the same files run back to back.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+?)::")
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*?) in (\d+(?:\.\d+)?)s")


def per_file(output: str) -> dict:
    """{file: seconds} and the run's summary line ("1996 passed ..." and its seconds)."""
    seconds: dict[str, float] = defaultdict(float)
    summary = None
    for line in output.splitlines():
        match = DURATION.match(line)
        if match:
            seconds[match.group(3)] += float(match.group(1))
        elif found := SUMMARY.search(line):
            summary = {"outcome": found.group(1), "seconds": float(found.group(2))}
    return {"files": dict(seconds), "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="pytest output with --durations=0 (one or two runs)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    runs = [per_file(path.read_text()) for path in args.runs]
    first = runs[0]["files"]
    top = sorted(first, key=first.get, reverse=True)[: args.top]
    table = {name: [round(run["files"].get(name, 0.0), 1) for run in runs] for name in top}
    print(json.dumps({"summaries": [run["summary"] for run in runs], "seconds_per_file": table}, indent=1))


if __name__ == "__main__":
    main()
