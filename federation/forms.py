"""The job submission form (validation of shapes here; of grants and schemas in ``job_submit``)."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from portal.selectors import projects_for_user
from sandbox.selectors import stewarded_institution_ids, usable_versions


class DatasetChoiceField(forms.ModelMultipleChoiceField):
    """Datasets by title, version and site; rows under the profile's disclosure rule unless the
    user is a steward of the dataset's institution (``exact_for``: institution ids)."""

    exact_for: set[int] = frozenset()

    def label_from_instance(self, obj) -> str:
        from sandbox.templatetags.sandbox_tags import disclosed

        site = obj.dataset.site
        rows = (
            f"{obj.row_count:,}"
            if site.institution_id in self.exact_for
            else disclosed(obj.row_count)
        )
        return f"{obj.dataset.title} v{obj.version} · {site.name} ({site.institution.name}) · {rows} rows"


class JobSubmitForm(forms.Form):
    """What a researcher chooses to run: project, one dataset per site, columns and training knobs."""

    title = forms.CharField(
        max_length=200, help_text="A short name you will recognise in the job list."
    )
    project = forms.ModelChoiceField(
        queryset=None, help_text="The job runs under this project's access grants and budget."
    )
    datasets = DatasetChoiceField(
        queryset=None,
        widget=forms.CheckboxSelectMultiple,
        help_text="Datasets your projects hold a valid grant for. Choose one per site, at least two.",
    )
    target_column = forms.CharField(
        max_length=200, help_text="The column to predict; it must exist at every chosen site."
    )
    feature_columns = forms.CharField(
        required=False,
        help_text="Comma-separated numeric columns. Leave empty to use every numeric column the "
        "datasets share, except the target.",
    )
    num_rounds = forms.IntegerField(
        min_value=1,
        max_value=100,
        initial=5,
        label="Rounds",
        help_text="FedAvg rounds: each is local training at every site, then aggregation.",
    )
    local_epochs = forms.IntegerField(
        min_value=1, max_value=100, initial=5, help_text="Passes over a site's data per round."
    )
    learning_rate = forms.FloatField(
        min_value=1e-6, max_value=10.0, initial=0.1, help_text="SGD step size at each site."
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        projects = projects_for_user(user=user)
        self.fields["project"].queryset = projects
        self.fields["datasets"].exact_for = stewarded_institution_ids(user=user)
        if len(projects) == 1:
            self.fields["project"].initial = projects[0].pk
        self.fields["datasets"].queryset = self._versions_queryset(projects)

    @staticmethod
    def _versions_queryset(projects):
        from sandbox.models import DatasetVersion

        ids = [v.pk for v in usable_versions(projects=projects)]
        return (
            DatasetVersion.objects.filter(pk__in=ids)
            .select_related("dataset__site__institution")
            .order_by("dataset__site__slug", "dataset__slug")
        )

    @property
    def column_names(self) -> list[str]:
        """Column names of the offered datasets, for the target field's suggestions."""
        names: dict[str, None] = {}
        for version in self.fields["datasets"].queryset:
            names.update((c["name"], None) for c in version.schema)
        return list(names)

    def clean_feature_columns(self) -> list[str]:
        raw = self.cleaned_data.get("feature_columns", "")
        cols = [c.strip() for c in raw.split(",") if c.strip()]
        if len(set(cols)) != len(cols):
            raise forms.ValidationError("A column is listed twice.")
        return cols

    def clean(self):
        cleaned = super().clean()
        target = cleaned.get("target_column")
        if target and target in cleaned.get("feature_columns", []):
            self.add_error("feature_columns", "The target column cannot also be a feature.")
        return cleaned


class JobScheduleForm(forms.Form):
    """When and where a job may run (its own fieldset on the job form, prefix ``sched``):
    resources per site, deadline, budget cap and schedule policy (issue 15)."""

    policy = forms.ChoiceField(
        required=False,
        choices=[
            ("asap", "As soon as possible"),
            ("cheapest", "Cheapest before the deadline"),
            ("greenest", "Lowest carbon before the deadline"),
        ],
        initial="asap",
        widget=forms.RadioSelect,
        help_text="Cheapest and lowest carbon may start later, at the best hours before the deadline.",
    )
    deadline = forms.DateTimeField(
        required=False,
        label="Results by",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="Your local time. Empty: no deadline (the shift looks up to a week ahead).",
    )
    budget_cap = forms.DecimalField(
        required=False,
        min_value=0.01,
        max_digits=14,
        decimal_places=2,
        label="Budget cap",
        help_text="The most this job may cost; a job whose cheapest start costs more is refused.",
    )
    cores = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=4096,
        initial=1,
        label="Cores per site",
        help_text="CPU cores.",
    )
    memory_gib = forms.DecimalField(
        required=False,
        min_value=0.1,
        max_value=100000,
        decimal_places=1,
        initial=1,
        label="Memory per site (GiB)",
    )
    gpus = forms.IntegerField(
        required=False, min_value=0, max_value=64, initial=0, label="GPUs per site"
    )
    preemptible = forms.BooleanField(
        required=False,
        help_text="May be stopped for higher-priority work; it then resumes from its last round.",
    )

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("prefix", "sched")
        super().__init__(*args, **kwargs)

    #: What a field left empty means (the same as the form's initial values).
    DEFAULTS = {"policy": "asap", "cores": 1, "memory_gib": Decimal("1"), "gpus": 0}

    def clean(self):
        cleaned = super().clean()
        for name, default in self.DEFAULTS.items():
            if cleaned.get(name) in (None, ""):
                cleaned[name] = default
        return cleaned

    def clean_deadline(self):
        from django.utils import timezone

        deadline = self.cleaned_data.get("deadline")
        if deadline is not None and deadline <= timezone.now():
            raise forms.ValidationError("The deadline has passed.")
        return deadline
