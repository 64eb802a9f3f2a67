"""``python -m training.platform_cli``: the platform's runs from a terminal, over its REST API.

    export PLATFORM_URL=http://127.0.0.1:8000 PLATFORM_TOKEN=...
    python -m training.platform_cli create --agent copy-task --dataset copy --reward char-accuracy \\
        --backend trl --model tiny-char --set trainer.total_training_steps=3 --follow
    python -m training.platform_cli list --status running
    python -m training.platform_cli follow 12
    python -m training.platform_cli cancel 12

Standard library only (``training.remote``); exit status 1 with the platform's message on an error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from training.remote import PlatformClient, PlatformError

FINAL = ("succeeded", "failed", "cancelled")


def _value(text: str) -> Any:
    """``--set key=value`` values as JSON when they parse (3, true, "x", [1]), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.platform_cli", description="The platform's runs from a terminal, over its REST API.")
    parser.add_argument("--url", help="platform address (default: $PLATFORM_URL)")
    parser.add_argument("--token", help="API token (default: $PLATFORM_TOKEN)")
    commands = parser.add_subparsers(dest="command", required=True)

    create = commands.add_parser("create", help="validate and queue a run (the run form's checks)")
    for name in ("agent", "dataset", "backend"):
        create.add_argument(f"--{name}", required=True, help=f"{name} name in the registry")
    create.add_argument("--reward", default="", help="reward function name")
    create.add_argument("--model", default="")
    create.add_argument("--name", default="")
    create.add_argument("--project", type=int, help="project id (default: a personal run)")
    create.add_argument("--visibility", choices=("private", "team"), default="private")
    create.add_argument("--tag", action="append", default=[], dest="tags")
    create.add_argument("--notes", default="")
    create.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    create.add_argument("--follow", action="store_true", help="then stream its metrics and log until it ends")

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
    """Print new metric steps and log lines until the run ends; returns its final status."""
    after_step, after_log = -1, 0
    while True:
        run = client.get_run(run_id)  # read status first: what it reports before ending is printed below
        for line in client.logs_after(run_id, after_log):
            after_log = line["id"]
            print(f"{line['time'][11:19]} {line['level']:<7} {line['message']}", file=out)
        news = client.metrics_after(run_id, after_step)
        by_step: dict[int, dict[str, Any]] = {}
        for key, pairs in news["points"].items():
            for step, value in pairs:
                by_step.setdefault(step, {})[key] = value
        for step in sorted(by_step):
            shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(by_step[step].items()))
            print(f"step {step} {shown}", file=out)
        after_step = news["last_step"]
        if run["status"] in FINAL:
            print(f"run {run_id} {run['status']}" + (f": {run['error']}" if run["error"] else ""), file=out)
            return run["status"]
        out.flush()
        time.sleep(interval)


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    try:
        client = PlatformClient(args.url, args.token)
        if args.command == "create":
            overrides = {}
            for item in args.set:
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"--set {item!r}: write KEY=VALUE.")
                overrides[key.strip()] = _value(value.strip())
            run = client.create_run(
                kind="platform", name=args.name, project=args.project, visibility=args.visibility,
                agent=args.agent, dataset=args.dataset, reward=args.reward, backend=args.backend, model=args.model,
                overrides=overrides, tags=args.tags, notes=args.notes,
            )
            print(f"run {run['id']} {run['status']}: {client.url}{run['url']}", file=out)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
