"""Where the test suite's time goes, per test file: the sum of pytest's per-test durations (setup,
call and teardown) from the output of a run with ``--durations=0``.

    PYTHONPATH=tests .venv/bin/python -m pytest -p platform_slots -n 2 --dist worksteal --durations=0 tests > before.txt
    python bench/suite_time.py before.txt [after.txt] [--top 25]

Prints each file's seconds (and, given two runs, both and their difference), slowest first, as
JSON. Durations are wall time inside each test process: on a shared machine they swing with the
neighbours' work, so compare runs made under the same load, or the same files run back to back.

CPU seconds do not swing with the neighbours' load as wall time does (only somewhat, through caches
and contention). ``--cpu`` runs pytest once per file given, in one process (no xdist), and prints
the user + sys seconds of pytest and every process it waited for (its servers, workers, training
processes), with the outcome line:

    python bench/suite_time.py --cpu tests/api/test_schema_fuzz.py [more files or node ids]

A whole run's CPU per file: run the suite with ``SUITE_CPU_REPORT=<folder>`` (tests/platform_slots.py
writes each test process's CPU per test there) and sum it:

    SUITE_CPU_REPORT=/tmp/cpu make test; python bench/suite_time.py --cpu-report /tmp/cpu

The same folder gives the test processes their order (tests/platform_slots.py: the longest files
first): each test's wall seconds, those of half a second or more, kept in tests/durations.json:

    python bench/suite_time.py --cpu-report /tmp/cpu --write-durations tests/durations.json
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


def cpu_of(target: str, python: str, pytest_args: list[str]) -> dict:
    """user + sys seconds of ``pytest target`` and of every child it (or its children) waited for."""
    import os
    import resource
    import subprocess
    import sys
    import time

    command = [python, "-m", "pytest", "-p", "platform_slots", "-q", "-p", "no:cacheprovider", *pytest_args, target]
    env = {**os.environ, "PYTHONPATH": "tests"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    outcome = next((line.strip("= ") for line in reversed(done.stdout.splitlines()) if " in " in line and
                    any(word in line for word in ("passed", "failed", "error", "skipped"))), done.stdout[-300:])
    if done.returncode not in (0, 5):
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-2000:])
    return {"cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "user_s": round(after.ru_utime - before.ru_utime, 1), "wall_s": round(wall, 1),
            "load_1min_at_end": round(os.getloadavg()[0], 1), "outcome": outcome}


def cpu_report(folder: Path, top: int) -> dict:
    """The CPU seconds per test file (and the slowest tests) that a run with SUITE_CPU_REPORT wrote."""
    tests: dict[str, float] = {}
    for path in sorted(folder.glob("*.json")):
        if not path.name.endswith(".wall.json"):
            tests.update(json.loads(path.read_text()))
    files: dict[str, float] = defaultdict(float)
    for nodeid, seconds in tests.items():
        files[nodeid.split("::")[0]] += seconds
    ranked = sorted(files.items(), key=lambda item: item[1], reverse=True)
    return {"tests": len(tests), "cpu_s_in_tests": round(sum(tests.values()), 1),
            "files": {name: round(seconds, 1) for name, seconds in ranked[:top]},
            "slowest_tests": {name: seconds for name, seconds in sorted(tests.items(), key=lambda item: item[1], reverse=True)[:top]},
            **wall_report(folder, tests, top)}


def wall_report(folder: Path, cpu: dict[str, float], top: int) -> dict:
    """Where the wall clock went: each test process's span and how long it sat idle after its last
    test (waiting for the others to finish), and the tests that took the most wall time for their CPU
    (they wait: on servers, timeouts, heartbeats)."""
    spans, walls = {}, {}
    for path in sorted(folder.glob("*.wall.json")):
        times = json.loads(path.read_text())
        walls.update({name: end - start for name, (start, end) in times.items()})
        if times:
            spans[path.name.removesuffix(".wall.json")] = (min(s for s, _ in times.values()), max(e for _, e in times.values()))
    if not spans:
        return {}
    first, last = min(s for s, _ in spans.values()), max(e for _, e in spans.values())
    waiting = sorted(((wall - cpu.get(name, 0.0), name) for name, wall in walls.items()), reverse=True)
    return {"wall": {"first_test_to_last_s": round(last - first, 1),
                     "idle_after_its_last_test_s": {name: round(last - end, 1) for name, (_, end) in sorted(spans.items())},
                     "wall_minus_cpu_s_most": {name: round(gap, 1) for gap, name in waiting[:top]}}}


LONG_TEST_SECONDS = 0.5  # shorter tests are counted at the suite's typical short test (tests/platform_slots.py)


def write_durations(folder: Path, target: Path) -> int:
    """Each test's wall seconds in the run ``folder`` holds (SUITE_CPU_REPORT), the long ones only."""
    walls = {}
    for path in sorted(folder.glob("*.wall.json")):
        walls.update({name: round(end - start, 1) for name, (start, end) in json.loads(path.read_text()).items()})
    long = {name: seconds for name, seconds in sorted(walls.items()) if seconds >= LONG_TEST_SECONDS}
    target.write_text(json.dumps(long, indent=0) + "\n")
    return len(long)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="pytest output with --durations=0 (one or two runs); with --cpu: test files; with --cpu-report: a folder")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--cpu", action="store_true", help="run each file given with pytest and print its CPU seconds")
    parser.add_argument("--cpu-report", action="store_true", help="runs: the folder a SUITE_CPU_REPORT run wrote")
    parser.add_argument("--write-durations", type=Path, help="with --cpu-report: write each long test's wall seconds there")
    parser.add_argument("--python", default=".venv/bin/python")
    parser.add_argument("--pytest-args", default="", help="more pytest arguments, one string")
    args = parser.parse_args()
    if args.cpu_report and args.write_durations:
        print(f"{write_durations(Path(args.runs[0]), args.write_durations)} tests written to {args.write_durations}")
        return
    if args.cpu_report:
        print(json.dumps(cpu_report(Path(args.runs[0]), args.top), indent=1))
        return
    if args.cpu:
        for target in args.runs:
            result = cpu_of(target, args.python, args.pytest_args.split())
            print(json.dumps({target: result}), flush=True)
        return
    args.runs = [Path(run) for run in args.runs]
    runs = [per_file(path.read_text()) for path in args.runs]
    first = runs[0]["files"]
    top = sorted(first, key=first.get, reverse=True)[: args.top]
    table = {name: [round(run["files"].get(name, 0.0), 1) for run in runs] for name in top}
    print(json.dumps({"summaries": [run["summary"] for run in runs], "seconds_per_file": table}, indent=1))


if __name__ == "__main__":
    main()
