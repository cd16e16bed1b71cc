"""``manage.py dataset_ingest``: the site-side ingest of a CSV file as a new dataset version."""

from __future__ import annotations

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from sandbox import services
from sandbox.csvformat import DELIMITER_NAMES, TYPES, missing_markers
from sandbox.forms import parse_types
from sandbox.keyring import SiteKeyring
from sandbox.storage import StorageError, store_from_url

# --delimiter takes the character or its name (and "\t" as typed in a shell for a tab).
DELIMITERS = {
    **{d: d for d in DELIMITER_NAMES},
    **{name: d for d, name in DELIMITER_NAMES.items()},
    "\\t": "\t",
}


class Command(BaseCommand):
    help = (
        "Ingest a CSV file at a site: validate, type, profile and encrypt it into the site's store "
        "with the site's key, and register it in the portal as the dataset's next (immutable) "
        "version. Exits non-zero with the line and column of the first problem for a bad file."
    )

    def add_arguments(self, parser):
        parser.add_argument("csv", type=Path, help="The CSV file to ingest.")
        parser.add_argument("--site", required=True, help="Slug of the site holding the data.")
        parser.add_argument("--dataset", required=True, help="Slug of the dataset at that site.")
        parser.add_argument("--title", default="", help="Title (required for a new dataset).")
        parser.add_argument("--description", default="", help="Description of a new dataset.")
        parser.add_argument(
            "--encoding",
            default=None,
            help="Python codec of the file (utf-8, utf-8-sig, cp1252, latin-1, utf-16); "
            "default: detected.",
        )
        parser.add_argument(
            "--delimiter",
            default=None,
            choices=sorted(DELIMITERS),
            help="comma, semicolon or tab; default: detected.",
        )
        parser.add_argument(
            "--missing",
            action="append",
            default=None,
            metavar="MARKER",
            help="A cell value read as missing, in addition to empty cells; repeat for several "
            "(--missing NA --missing -999).",
        )
        parser.add_argument(
            "--no-default-missing",
            action="store_true",
            help='Do not read empty cells ("") as missing: only the --missing markers are.',
        )
        parser.add_argument(
            "--type",
            action="append",
            default=[],
            metavar="COLUMN=TYPE",
            help=f"Override a column's inferred type; TYPE is one of {', '.join(TYPES)}. Repeat.",
        )
        parser.add_argument(
            "--store",
            default=None,
            help="The site's object store URL (file:///path or s3://KEY:SECRET@host:port/bucket); "
            "default: the site's local store under FRP_SITES_DIR.",
        )
        parser.add_argument(
            "--keyring",
            default=None,
            type=Path,
            help="The site's keyring directory; default: the local one under FRP_SITES_DIR.",
        )
        parser.add_argument(
            "--by", default=None, help="Username of the data steward to record (optional)."
        )

    def handle(self, *args, **opts):
        from portal.models import Site

        try:
            site = Site.objects.select_related("institution").get(slug=opts["site"])
        except Site.DoesNotExist:
            raise CommandError(f"no site {opts['site']!r} is registered in the portal") from None
        by = None
        if opts["by"]:
            try:
                by = get_user_model().objects.get(username=opts["by"])
            except get_user_model().DoesNotExist:
                raise CommandError(f"no user {opts['by']!r}") from None
        try:
            overrides = parse_types(opts["type"])
            store = store_from_url(opts["store"]) if opts["store"] else None
        except (ValueError, StorageError) as exc:
            raise CommandError(str(exc)) from None
        if not opts["csv"].is_file():
            raise CommandError(f"{opts['csv']}: no such file")
        try:
            dv = services.dataset_ingest(
                by=by,
                site=site,
                path=opts["csv"],
                slug=opts["dataset"],
                title=opts["title"],
                description=opts["description"],
                store=store,
                keyring=SiteKeyring(opts["keyring"]) if opts["keyring"] else None,
                encoding=opts["encoding"],
                delimiter=DELIMITERS[opts["delimiter"]] if opts["delimiter"] else None,
                missing_values=missing_markers(
                    opts["missing"] or (), defaults=not opts["no_default_missing"]
                ),
                schema_override=overrides or None,
            )
        except services.IngestError as exc:
            raise CommandError(f"{opts['csv']}: {exc}") from None
        except (services.DatasetError, services.KeyringError, services.StorageError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Registered {site.slug}/{dv.dataset.slug} version {dv.version}: {dv.row_count} rows, "
            f"{len(dv.schema)} columns, encoding {dv.encoding} ({dv.encoding_source}), delimiter "
            f"{dv.delimiter_name} ({dv.delimiter_source}), missing {dv.missing_values}; "
            f"{dv.size_bytes} bytes encrypted at {dv.store_key}."
        )
        for warning in getattr(dv, "ingest_warnings", ()):
            self.stderr.write(f"Warning: {warning}")
