"""Housekeeping of the artifact store: ``orphans`` lists objects no row names (``--delete`` removes
them), ``retention`` applies each project's checkpoint count to every run that has ended."""

from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandParser

from webapp.runs import artifacts
from webapp.runs.models import Run


class Command(BaseCommand):
    help = "List or remove orphaned objects in the artifact store, or apply checkpoint retention."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        orphans = sub.add_parser("orphans", help="Run folders whose run is gone, uploads no row names.")
        orphans.add_argument("--delete", action="store_true", help="Remove them (default: only list them).")
        orphans.add_argument("--min-age-minutes", type=int, default=60,
                             help="Leave objects written more recently alone (a row may be being written); default 60.")
        sub.add_parser("retention", help="Keep each ended run's newest checkpoints, as its project says.")

    def handle(self, *args, action: str, **options) -> None:
        if action == "orphans":
            found = artifacts.orphans(older_than=timedelta(minutes=max(0, options["min_age_minutes"])))
            for key in found:
                removed = artifacts.store().delete(key) if options["delete"] else None
                self.stdout.write(f"{key}" + (f"  removed ({removed} object(s))" if removed is not None else ""))
            verb = "removed" if options["delete"] else "found (run again with --delete to remove them)"
            self.stdout.write(f"{len(found)} orphan(s) {verb} in {artifacts.store().url}.")
        else:
            total = 0
            for run in Run.objects.filter(status__in=Run.FINAL).select_related("project"):
                removed = artifacts.apply_retention(run)
                total += len(removed)
                for key in removed:
                    self.stdout.write(f"{key}  removed")
            self.stdout.write(f"{total} checkpoint(s) removed.")
