"""``manage.py ledger_verify``: recompute the whole ledger and name the first bad index."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from portal.ledger.selectors import ledger_verify


class Command(BaseCommand):
    help = (
        "Recompute every leaf hash from its data, check the indexes are dense from 0, and check "
        "every checkpoint's root, signature and cosignatures. Exits 1 naming the first bad index. "
        "Says what it cannot detect from the database alone (a shortened ledger, without a "
        "witness)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--chunk", type=int, default=10_000, help="Rows per database round trip."
        )

    def handle(self, *args, chunk: int, **options):
        report = ledger_verify(chunk=chunk)
        self.stderr.write(f"Not checked: {report.limits}")
        if report.missing_guards:
            raise CommandError(
                "ledger verification FAILED: the database no longer refuses every change to "
                "the ledger; its append-only triggers: "
                + "; ".join(report.missing_guards)
                + " (recreate them as their migrations make them, and find out who changed them)"
            )
        if not report.ok:
            for problem in report.problems:
                self.stderr.write(f"  {problem}")
            first = report.problems[0]
            raise CommandError(
                f"ledger verification FAILED at index {first.index}: {first.message} "
                f"({len(report.problems)} problem(s) listed above)"
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"ledger OK: {report.leaves} leaves, {report.checkpoints} checkpoints, "
                f"{report.cosignatures} cosignatures verified (within the limits above)"
            )
        )
