"""``manage.py retention [--dry-run] [--json]``: what retention removes (runtime.retention), by
hand. Beat starts the same run every RETENTION_SECONDS; this one runs in the shell, now."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from runtime.retention import retention_run


class Command(BaseCommand):
    help = (
        "Archive and remove ended tasks older than RETENTION_TASK_DAYS and Idempotency-Key "
        "records older than IDEMPOTENCY_KEY_HOURS; --dry-run only says what would go."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="change nothing; count what would go"
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        report = retention_run(dry_run=options["dry_run"]).as_dict()
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
            return
        verb = "would remove" if report["dry_run"] else "removed"
        self.stdout.write(self._line("tasks", verb, report["tasks"], settings.RETENTION_TASK_DAYS))
        for table, n in report["tasks"].get("rows", {}).items():
            self.stdout.write(f"  {table}: {n}")
        self.stdout.write(
            self._line(
                "Idempotency-Key records",
                verb,
                report["idempotency_keys"],
                settings.IDEMPOTENCY_KEY_HOURS,
                unit="hours",
            )
        )
        counters = report["rate_counters"]["count"]
        self.stdout.write(f"rate-limit counters past their window: {verb} {counters}")
        if report["skipped"]:
            self.stdout.write(f"skipped {report['skipped']} task trees that moved or were busy")
        for name in report["archives"]:
            self.stdout.write(f"archive: {name}")

    @staticmethod
    def _line(
        label: str, verb: str, found: dict[str, Any], after: float, unit: str = "days"
    ) -> str:
        if after <= 0:
            return f"{label}: kept for ever (the setting is 0)"
        span = f" (oldest {found['oldest']}, newest {found['newest']})" if found["count"] else ""
        return f"{label} older than {after:g} {unit}: {verb} {found['count']}{span}"
