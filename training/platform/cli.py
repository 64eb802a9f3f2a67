"""``agent-trainer-platform`` (or ``python -m training.platform.cli``): the platform's runs from a
terminal, over its REST API.

    agent-trainer-platform login --url http://127.0.0.1:8000      # asks username and password, stores a token
    agent-trainer-platform create --agent copy-task --dataset copy --reward char-accuracy \\
        --backend trl --model tiny-char --set trainer.total_training_steps=3 --follow
    agent-trainer-platform fork 12 --step 40 --set actor_rollout_ref.actor.optim.lr=1e-6 --follow
    agent-trainer-platform list --status running
    agent-trainer-platform follow 12                                 # one line per step until it ends
    agent-trainer-platform cancel 12

The address and token come from ``--url``/``--token``, else $PLATFORM_URL/$PLATFORM_TOKEN, else what
``login`` stored. Standard library only (``training.platform.reporter``); exit status 1 with the platform's
message, as a sentence, on an error.
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import sys
import time
from typing import Any, TextIO

from training.platform.reporter import PlatformClient, URL_ENV, obtain_token, store_credentials, stored_credentials

from training.errors import PlatformError
from training.tracking.sinks import ConsoleSink

FINAL = ("succeeded", "failed", "cancelled", "pruned")
# The trainer logs a summary line per step; `follow` prints its own line per step from the metrics instead.
STEP_SUMMARY = re.compile(r"^step \d+(/\d+)? ")
# Shown per step when a run logs none of the headline metrics.
MAX_OTHER_KEYS = 6


def _value(text: str) -> Any:
    """``--set key=value`` values as JSON when they parse (3, true, "x", [1]), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-trainer-platform", description="The platform's runs from a terminal, over its REST API.")
    parser.add_argument("--url", help="platform address (default: $PLATFORM_URL, then the one `login` stored)")
    parser.add_argument("--token", help="API token (default: $PLATFORM_TOKEN, then the one `login` stored)")
    commands = parser.add_subparsers(dest="command", required=True)

    login = commands.add_parser("login", help="trade your username and password for an API token and store it")
    login.add_argument("--username", help="(asked when left out)")
    login.add_argument("--password-stdin", action="store_true", help="read the password from standard input")

    create = commands.add_parser("create", help="validate and queue a run (the run form's checks)")
    for name in ("agent", "dataset"):
        create.add_argument(f"--{name}", required=True, help=f"{name} name (or id) in the registry; a wrong one is answered with the names you may use")
    create.add_argument("--backend", required=True, help="backend name")
    create.add_argument("--reward", default="", help="reward function name")
    create.add_argument("--model", default="")
    create.add_argument("--name", default="")
    create.add_argument("--project", type=int, help="project id (default: a personal run)")
    create.add_argument("--visibility", choices=("private", "team"), default="private")
    create.add_argument("--tag", action="append", default=[], dest="tags")
    create.add_argument("--notes", default="")
    create.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    create.add_argument("--follow", action="store_true", help="then stream its metrics and log until it ends")

    fork = commands.add_parser("fork", help="start a new run from a stored checkpoint of a run you may see")
    fork.add_argument("run", type=int)
    fork.add_argument("--step", type=int, required=True, help="the step of the run's checkpoint to start from")
    for name in ("agent", "dataset", "reward"):
        fork.add_argument(f"--{name}", default="", help=f"{name} name (default: the run's)")
    fork.add_argument("--name", default="")
    where = fork.add_mutually_exclusive_group()
    where.add_argument("--project", type=int, help="project id (default: the run's project)")
    where.add_argument("--personal", action="store_true", help="a personal run, in no project")
    fork.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config key changed from the run's (repeatable)")
    fork.add_argument("--follow", action="store_true", help="then stream its metrics and log until it ends")

    listing = commands.add_parser("list", help="runs you may see, newest first")
    listing.add_argument("--status")
    listing.add_argument("--project", type=int)
    listing.add_argument("--tag")
    listing.add_argument("--kind", choices=("platform", "external"))
    listing.add_argument("--json", action="store_true", help="print the API's JSON")

    follow = commands.add_parser("follow", help="stream a run's metrics and log until it ends")
    follow.add_argument("run", type=int)
    follow.add_argument("--interval", type=float, default=2.0, help="seconds between polls")

    cancel = commands.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run", type=int)
    return parser


def follow_run(client: PlatformClient, run_id: int, out: TextIO, interval: float = 2.0) -> str:
    """Print one line per new step (its headline metrics) and the log's other lines until the run
    ends; returns its final status."""
    after_step, after_log = -1, 0
    total = _total_steps(client.get_run(run_id))
    while True:
        run = client.get_run(run_id)  # read status first: what it reports before ending is printed below
        for line in client.logs_after(run_id, after_log):
            after_log = line["id"]
            if not STEP_SUMMARY.match(line["message"]):
                print(f"{line['time'][11:19]} {line['level']:<7} {line['message']}", file=out)
        news = client.metrics_after(run_id, after_step)
        by_step: dict[int, dict[str, Any]] = {}
        for key, pairs in news["points"].items():
            for step, value in pairs:
                by_step.setdefault(step, {})[key] = value
        for step in sorted(by_step):
            print(step_line(step, total, by_step[step]), file=out)
        after_step = max(after_step, news["last_step"])
        if run["status"] in FINAL:
            print(final_line(run), file=out)
            for warning in run.get("warnings") or []:
                print(f"warning: {warning}", file=out)
            return run["status"]
        out.flush()
        time.sleep(interval)


def final_line(run: dict) -> str:
    """``run 12: training finished: 150 steps, status succeeded``; any other end says what it was."""
    status, steps = run["status"], run.get("steps") or 0
    verb = {"succeeded": "finished", "failed": "failed", "cancelled": "cancelled", "pruned": "stopped"}.get(status, "ended")
    if status == "succeeded" and run.get("warnings"):
        status += ", but it learnt nothing (warning below)"
    elif status == "pruned":
        status += " (its sweep stopped it early)"
    return f"run {run['id']}: training {verb}: {steps} step{'' if steps == 1 else 's'}, status {status}" + (f": {run['error']}" if run.get("error") else "")


def step_line(step: int, total: int | None, metrics: dict[str, Any]) -> str:
    """``step 3/20 reward=0.41 loss=0.02 ...``: the headline metrics, else the first few in name order."""
    keys = [k for k in ConsoleSink.HEADLINE if k in metrics] or sorted(metrics)[:MAX_OTHER_KEYS]
    shown = " ".join(f"{k}={metrics[k]:.4g}" if isinstance(metrics[k], float) else f"{k}={metrics[k]}" for k in keys)
    return f"step {step}{f'/{total}' if total else ''} {shown}"


def _total_steps(run: dict) -> int | None:
    """The run's step budget when its overrides name one (the backend's default is not in the API)."""
    value = (run.get("config_overrides") or {}).get("trainer.total_training_steps")
    return value if isinstance(value, int) else None


def log_in(url: str | None, username: str | None, password_stdin: bool, out: TextIO) -> None:
    import os

    url = url or os.environ.get(URL_ENV, "") or stored_credentials().get("url") or input("Platform address: ").strip()
    username = username or input("Username: ").strip()
    password = sys.stdin.readline().rstrip("\n") if password_stdin else getpass.getpass("Password: ")
    token = obtain_token(url, username, password)
    path = store_credentials(url, token)
    print(f"Logged in to {url.rstrip('/')} as {username}; the token is stored in {path}.", file=out)


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "login":
            log_in(args.url, args.username, args.password_stdin, out)
            return 0
        client = PlatformClient(args.url, args.token)
        if args.command in ("create", "fork"):
            overrides = {}
            for item in args.set:
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"--set {item!r}: write KEY=VALUE.")
                overrides[key.strip()] = _value(value.strip())
            if args.command == "create":
                run = client.create_run(
                    kind="platform", name=args.name, project=args.project, visibility=args.visibility,
                    agent=args.agent, dataset=args.dataset, reward=args.reward, backend=args.backend, model=args.model,
                    overrides=overrides, tags=args.tags, notes=args.notes,
                )
            else:
                where = {"project": None} if args.personal else {"project": args.project} if args.project else {}
                run = client.fork_run(args.run, args.step, name=args.name, agent=args.agent, dataset=args.dataset,
                                      reward=args.reward, overrides=overrides, **where)
            print(f"run {run['id']} {run['status']}: {client.url}{run['url']}", file=out)
            if run.get("fork_note"):
                print(run["fork_note"], file=out)
            if args.follow:
                return 0 if follow_run(client, run["id"], out) == "succeeded" else 1
        elif args.command == "list":
            runs = client.list_runs(status=args.status, project=args.project, tag=args.tag, kind=args.kind)
            if args.json:
                print(json.dumps(runs, indent=2), file=out)
            for run in [] if args.json else runs:
                tags = f" [{', '.join(run['tags'])}]" if run["tags"] else ""
                print(f"{run['id']:>6}  {run['status']:<10} {run['kind']:<9} {run['steps']:>6} steps  {run['name']}{tags}", file=out)
        elif args.command == "follow":
            return 0 if follow_run(client, args.run, out, args.interval) == "succeeded" else 1
        elif args.command == "cancel":
            run = client.cancel_run(args.run)
            print(f"run {run['id']} {run['status']}" + (" (stopping at its next step)" if run["status"] == "running" else ""), file=out)
    except (PlatformError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, EOFError):
        print("", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
