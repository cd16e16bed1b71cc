"""The job submission form (validation of shapes here; of grants and schemas in ``job_submit``)."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from federation import columns as job_columns
from frp_flwr.contract import FEATURE_KINDS, MISSING_RULES, RULES_FOR_KIND, FeaturePlan
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
        help_text="For scripted posts without the columns table: comma-separated columns. Empty: "
        "every numeric column the datasets share, except the target and identifier-like ones.",
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
    secure_aggregation = forms.BooleanField(
        required=False,
        label="Secure aggregation (SecAgg+)",
        help_text="The server sees only the sum of the sites' model updates, never one site's "
        "(Flower's SecAgg+; each round takes four exchanges instead of one). Because no "
        "individual update exists, contribution is then measured by data volume and compute "
        "(each site's training examples and metered work), not by Shapley value.",
    )

    columns_for = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        projects = projects_for_user(user=user)
        self.fields["project"].queryset = projects
        self.fields["datasets"].exact_for = stewarded_institution_ids(user=user)
        if len(projects) == 1:
            self.fields["project"].initial = projects[0].pk
        self.fields["datasets"].queryset = self._versions_queryset(projects)
        self.columns = self._add_column_fields()

    # --- the columns table: one row of fields per column the chosen datasets share -----------

    def chosen_versions(self) -> list:
        """The offered dataset versions the (bound) form has ticked, in the queryset's order."""
        if not self.is_bound:
            return []
        ids = {v for v in self.data.getlist(self.add_prefix("datasets")) if str(v).isdigit()}
        return [v for v in self.fields["datasets"].queryset if str(v.pk) in ids]

    @staticmethod
    def signature(versions) -> str:
        """Which versions a columns table was drawn for (its rows depend on them)."""
        return ",".join(str(v.pk) for v in sorted(versions, key=lambda v: v.pk))

    def _add_column_fields(self) -> list:
        versions = self.chosen_versions()
        cols = job_columns.common_columns(versions)
        key = self.add_prefix("columns_for")
        sent = self.is_bound and key in self.data
        #: The post carries the columns table drawn for the datasets it chose.
        self.table_posted = sent and self.data.get(key) == self.signature(versions)
        #: A columns table was posted, but for other datasets than those chosen now.
        self.table_stale = sent and not self.table_posted
        fresh = not self.table_posted  # a new table: its fields show the careful defaults
        target = (
            (self.data.get(self.add_prefix("target_column")) or "").strip() if self.is_bound else ""
        )
        for i, col in enumerate(cols):
            plan = col.default_plan() if col.kinds else None
            kinds = [(k, job_columns.KIND_LABELS[k]) for k in col.kinds]
            rules = [
                (r, job_columns.RULE_LABELS[r])
                for r in MISSING_RULES
                if any(r in RULES_FOR_KIND[k] for k in col.kinds)
            ]
            self.fields[f"col{i}_name"] = forms.CharField(
                initial=col.name, widget=forms.HiddenInput, required=False
            )
            check = forms.CheckboxInput(attrs={"class": "form-check-input"})
            select = forms.Select(attrs={"class": "form-select form-select-sm"})
            self.fields[f"col{i}_use"] = forms.BooleanField(
                required=False,
                initial=col.preselected and col.name != target,
                widget=check,
                label=f"Use {col.name}",
                disabled=not col.kinds,
            )
            self.fields[f"col{i}_kind"] = forms.ChoiceField(
                choices=kinds or [("", "—")],
                required=False,
                initial=plan.kind if plan else "",
                widget=select,
                label=f"{col.name}: treat as",
            )
            self.fields[f"col{i}_missing"] = forms.ChoiceField(
                choices=rules or [("", "—")],
                required=False,
                initial=plan.missing if plan else "",
                widget=select,
                label=f"{col.name}: missing values",
            )
            self.fields[f"col{i}_indicator"] = forms.BooleanField(
                required=False,
                initial=plan.indicator if plan else False,
                widget=forms.CheckboxInput(attrs={"class": "form-check-input"}),
                label=f"{col.name}: add a missing indicator",
            )
            col.fields = {
                part: self[f"col{i}_{part}"]
                for part in ("name", "use", "kind", "missing", "indicator")
            }
            col.is_target = col.name == target
            if fresh and self.is_bound:
                # Unposted fields of a new table: show their defaults instead of "unticked".
                data = self.data.copy()
                for part in ("name", "use", "kind", "missing", "indicator"):
                    key = self.add_prefix(f"col{i}_{part}")
                    initial = self.fields[f"col{i}_{part}"].initial
                    if isinstance(initial, bool):
                        if initial:
                            data[key] = "on"
                        else:
                            data.pop(key, None)
                    else:
                        data[key] = initial
                self.data = data
        if self.is_bound:
            data = self.data.copy()
            data[self.add_prefix("columns_for")] = self.signature(versions)
            self.data = data
        return cols

    def table_choice(self) -> tuple[list[str], list[FeaturePlan]]:
        """Features and their plans from the columns table (call after ``is_valid``)."""
        target = self.cleaned_data.get("target_column", "")
        features, plans = [], []
        for i, col in enumerate(self.columns):
            if not self.cleaned_data.get(f"col{i}_use") or col.name == target:
                continue
            if self.cleaned_data.get(f"col{i}_name") != col.name:
                self.add_error(None, "The columns changed while you chose them: check them again.")
                continue
            kind = self.cleaned_data.get(f"col{i}_kind") or col.default_kind
            rule = self.cleaned_data.get(f"col{i}_missing") or RULES_FOR_KIND[kind][0]
            if kind not in FEATURE_KINDS or rule not in RULES_FOR_KIND[kind]:
                self.add_error(
                    f"col{i}_missing",
                    f"{job_columns.RULE_LABELS.get(rule, rule)} does not apply to "
                    f"{job_columns.KIND_LABELS.get(kind, kind).lower()} values.",
                )
                continue
            features.append(col.name)
            plans.append(
                FeaturePlan(
                    name=col.name,
                    kind=kind,
                    missing=rule,
                    indicator=bool(self.cleaned_data.get(f"col{i}_indicator")),
                )
            )
        return features, plans

    @property
    def task_hint(self) -> str:
        """What the chosen target makes of the job, for the form (``""`` before one is chosen)."""
        target = (
            (self.data.get(self.add_prefix("target_column")) or "").strip() if self.is_bound else ""
        )
        for col in self.columns:
            if col.name == target:
                try:
                    task = job_columns.task_for(col)
                except ValueError as exc:
                    return str(exc)
                model = "linear regression" if task == "regression" else "logistic regression"
                return f"{task.capitalize()} ({col.type} target): {model}."
        return ""

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
        """Suggestions for the target field: the chosen datasets' common columns, else every
        column of the offered datasets."""
        if self.columns:
            return [c.name for c in self.columns]
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
        if self.table_posted:
            cleaned["feature_columns"], cleaned["preprocessing"] = self.table_choice()
            if not cleaned["feature_columns"] and self.columns:
                self.add_error(None, "Tick at least one feature column.")
        else:
            cleaned["preprocessing"] = []
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
