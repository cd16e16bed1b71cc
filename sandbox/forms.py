"""Forms of the sandbox: access requests, the steward's decisions and dataset uploads."""

from __future__ import annotations

from django import forms
from django.utils import timezone

from portal.choice_fields import ModelChoiceField
from portal.selectors import projects_for_user
from sandbox.csvformat import DELIMITER_NAMES, TYPES, missing_markers


class AccessRequestForm(forms.Form):
    project = ModelChoiceField(queryset=None, help_text="The project that will use the data.")
    purpose = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=2000,
        help_text="What the data is for; the data steward decides on this.",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects_for_user(user=user)


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("refuse", "Refuse")])
    expires_on = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="The grant is valid through this day (until 23:59:59 UTC).",
    )
    reason = forms.CharField(required=False, max_length=2000, help_text="Required to refuse.")

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("decision") == "approve":
            day = cleaned.get("expires_on")
            if day is None:
                self.add_error("expires_on", "An approval needs an expiry date.")
            elif day <= timezone.now().date():
                self.add_error("expires_on", "Choose a day after today.")
        elif cleaned.get("decision") == "refuse" and not cleaned.get("reason", "").strip():
            self.add_error("reason", "Give the researcher a reason.")
        return cleaned

    @property
    def expires_at(self):
        day = self.cleaned_data.get("expires_on")
        if day is None:
            return None
        from datetime import UTC, datetime, time

        return datetime.combine(day, time.max, tzinfo=UTC)  # shown as that day, valid through it


ENCODINGS = [
    ("", "Detect"),
    ("utf-8", "UTF-8"),
    ("utf-8-sig", "UTF-8 with byte-order mark"),
    ("cp1252", "Windows-1252 (Western European)"),
    ("latin-1", "Latin-1 (ISO-8859-1)"),
    ("utf-16", "UTF-16 (with byte-order mark)"),
]
DELIMITERS = [("", "Detect")] + [
    (d, f"{name.capitalize()} {d}".strip()) for d, name in DELIMITER_NAMES.items()
]


def parse_types(items: list[str]) -> dict[str, str]:
    """``["zip=str", "age=int"]`` → ``{"zip": "str", "age": "int"}``; ``ValueError`` naming the bad
    item otherwise (no ``=``, empty column, a repeated column, or a type not in
    ``sandbox.csvformat.TYPES``)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, kind = item.partition("=")
        name, kind = name.strip(), kind.strip().lower()
        if not sep or not name:
            raise ValueError(
                f"{item.strip()!r}: write a type override as column=type, e.g. zip=str"
            )
        if kind not in TYPES:
            raise ValueError(f"{item.strip()!r}: the type must be one of {', '.join(TYPES)}")
        if name in out:
            raise ValueError(f"column {name!r} has two type overrides")
        out[name] = kind
    return out


def parse_type_overrides(text: str) -> dict[str, str]:
    """``"zip=str\\nage = int"`` (one per line or comma-separated) → ``{"zip": "str", "age": "int"}``.

    Raises ``forms.ValidationError`` naming the bad entry.
    """
    items = [part for line in text.splitlines() for part in line.split(",") if part.strip()]
    try:
        return parse_types(items)
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from None


class DatasetUploadForm(forms.Form):
    """A data steward's upload of a CSV file as a new dataset, or a new version of one."""

    site = ModelChoiceField(
        queryset=None,
        empty_label=None,
        help_text="Your institution's site that will hold the encrypted data.",
    )
    dataset = ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="— a new dataset —",
        help_text="Choose an existing dataset to add a new version (earlier versions stay "
        "unchanged), or leave as a new dataset and give its slug and title below.",
    )
    slug = forms.SlugField(
        required=False,
        max_length=100,
        label="Slug (new dataset)",
        help_text="Short identifier: lower-case letters, digits, '-' or '_', e.g. breast-cancer.",
    )
    title = forms.CharField(
        required=False,
        max_length=200,
        label="Title (new dataset)",
        help_text="What researchers see in the catalogue.",
    )
    description = forms.CharField(
        required=False,
        max_length=5000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Cohort, period, collection; no patient-level values.",
    )
    file = forms.FileField(
        label="CSV file",
        help_text="Streamed to a temporary file at the site, encrypted with the site's key, then "
        "deleted; the portal keeps only the schema and a disclosure-controlled profile.",
    )
    encoding = forms.ChoiceField(
        choices=ENCODINGS,
        required=False,
        help_text="Detect reads a byte-order mark, else tries UTF-8, then Windows-1252.",
    )
    delimiter = forms.ChoiceField(
        choices=DELIMITERS,
        required=False,
        help_text="Detect looks at the first lines; a comma is the fallback.",
    )
    empty_is_missing = forms.BooleanField(
        required=False,
        initial=True,
        label="Empty cells are missing",
        help_text="Untick only if an empty cell is a real value.",
    )
    missing_markers = forms.CharField(
        required=False,
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Other missing-value markers",
        help_text="One per line, e.g. NA or -999. Declared per dataset, so a country code NA is "
        "not silently missing.",
    )
    types = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Column types",
        help_text="Override inferred types, one column=type per line, e.g. zip=str. Types: int, "
        "float, bool, date (YYYY-MM-DD), str. Every value must fit.",
    )

    def __init__(self, *args, sites, datasets, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["site"].queryset = sites
        self.fields["dataset"].queryset = datasets
        self.fields["dataset"].label_from_instance = lambda d: f"{d.title} ({d.site.slug}/{d.slug})"

    def clean_types(self) -> dict[str, str]:
        return parse_type_overrides(self.cleaned_data.get("types", ""))

    def clean(self):
        cleaned = super().clean()
        dataset, site = cleaned.get("dataset"), cleaned.get("site")
        if dataset is not None:
            if site is not None and dataset.site_id != site.pk:
                self.add_error("dataset", "This dataset is held at another site.")
            cleaned["slug"], cleaned["title"] = dataset.slug, dataset.title
        else:
            if not cleaned.get("slug") and "slug" not in self.errors:
                self.add_error("slug", "Give the new dataset a slug.")
            elif site is not None and site.datasets.filter(slug=cleaned.get("slug")).exists():
                self.add_error(
                    "slug",
                    "This site already has a dataset with this slug: choose it above to add a "
                    "new version.",
                )
            if not cleaned.get("title", "").strip():
                self.add_error("title", "Give the new dataset a title.")
        markers = [m.strip() for m in cleaned.get("missing_markers", "").splitlines() if m.strip()]
        cleaned["missing_values"] = list(
            missing_markers(markers, defaults=bool(cleaned.get("empty_is_missing")))
        )
        return cleaned


class PrivacyBudgetForm(forms.Form):
    """A data steward's ε budget for one grant's project and dataset (empty: no budget)."""

    epsilon = forms.FloatField(
        required=False,
        min_value=0.01,
        max_value=1000,
        label="ε budget",
        help_text="The total ε this project may spend on this dataset over all its differentially "
        "private jobs; a job that would exceed it is refused at submission. Empty: no budget.",
    )


class _TickBox(forms.CheckboxInput):
    """A check box read as sent: absent (unticked) or the browser's ``"on"``. Django's own
    reads any other text but ``"false"`` as ticked, so a scripted ``shapley_opt_in=off`` or
    ``=0`` opted a dataset in (a hostile tester's finding); :class:`TickField` refuses those."""

    def value_from_datadict(self, data, files, name):
        return data.get(name)


class TickField(forms.BooleanField):
    """A check box that is off when absent, on for ``"on"``, and an error for anything else."""

    widget = _TickBox

    def to_python(self, value):
        if value in (None, "", False):
            return False
        if value is True or value == "on":
            return True
        raise forms.ValidationError('A check box is sent as "on" or not at all.')


class DatasetRulesForm(forms.Form):
    """A data steward's standing rules for one dataset: the airlock's automatic release and the
    consent to Shapley-value contribution (``Dataset.auto_release``, ``Dataset.shapley_opt_in``)."""

    auto_release = TickField(
        required=False,
        label="Release models automatically",
        help_text="Approve the release of models trained on this dataset without a manual "
        "review in the airlock.",
    )
    shapley_opt_in = TickField(
        required=False,
        label="Allow Shapley-value contribution",
        help_text="To measure Shapley values, a job sends every one of its sites the models of "
        "all coalitions of sites, among them a model trained on this dataset alone: the other "
        "sites could then work out this site's model update, and from it facts about its rows "
        "(ADR 0036). Unticked: jobs using this dataset, running ones from their next round, send "
        "no such models and credit every site by data volume. Independently of this rule, every "
        "site of a gradient-boosted trees job receives the others' trees, and in a two-site job "
        "each site can work out the other's update from the global model.",
    )
