"""``manage.py demo_seed``: three hospitals with sites, pools, stewards, encrypted datasets, a project."""

from django.core.management.base import BaseCommand

from demo.seed import DEMO_PASSWORD, demo_seed


class Command(BaseCommand):
    help = "Create the demo institutions, sites, datasets (ingested per site) and project."

    def add_arguments(self, parser):
        parser.add_argument(
            "--canary", help="Plant this value in hospital-a's data (residency test)."
        )

    def handle(self, *args, canary=None, **options):
        project = demo_seed(canary=canary)
        self.stdout.write(
            f"Demo ready: project {project.slug!r}; sign in as 'ada' / '{DEMO_PASSWORD}'."
        )
