"""The job submission form (validation of shapes here; of grants and schemas in ``job_submit``)."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from federation import columns as job_columns
from frp_flwr.contract import FEATURE_KINDS, MISSING_RULES, RULES_FOR_KIND, FeaturePlan
from frp_flwr.models import MLP_DEFAULTS, XGBOOST_PARAMS, ModelSpecError, read_model_spec
from frp_flwr.strategies import LABELS, STRATEGIES, StrategySpecError, read_strategy_spec
from portal.choice_fields import ModelChoiceField, ModelMultipleChoiceField
from portal.selectors import projects_for_user
from sandbox.selectors import stewarded_institution_ids, usable_versions


def _xgb_field(name: str, label: str, help_text: str) -> forms.Field:
    """The form field of XGBoost hyper-parameter ``name``: its type, default and range are
    ``frp_flwr.models.XGBOOST_PARAMS``'s (the contract checks the same table)."""
    kind, default, lo, hi = XGBOOST_PARAMS[name]
    field = forms.IntegerField if kind is int else forms.FloatField
    return field(
        min_value=lo,
        max_value=hi,
        initial=default,
        required=False,
        label=label,
        help_text=help_text,
    )


#: The job form's help for each model (the template shows the chosen one's).
MODEL_HELP = {
    "linear": "Logistic regression (linear regression for a numeric target) is convex and needs "
    "few rounds.",
    "mlp": "An MLP learns non-linear effects and needs more rounds and data.",
    "xgboost": "Gradient-boosted trees: every round each site adds boosting rounds on top of the "
    "global trees and the portal appends every site's new trees (Flower's FedXgbBagging: keep "
    "the strategy at FedAvg). Trees are credited by data volume, not Shapley value (coalition "
    "models cannot be rebuilt from bagged trees, ADR 0023).",
}

#: The job form's field of each strategy parameter (``frp_flwr.strategies.STRATEGIES``).
STRATEGY_FIELDS = {
    "mu": "fedprox_mu",
    "eta": "server_eta",
    "eta_l": "server_eta_l",
    "tau": "server_tau",
    "beta_1": "server_beta_1",
    "beta_2": "server_beta_2",
    "beta": "trimmed_beta",
    "num_malicious_nodes": "krum_faulty",
}


class DatasetChoiceField(ModelMultipleChoiceField):
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
        shapley = " · Shapley values allowed" if obj.dataset.shapley_opt_in else ""
        return (
            f"{obj.dataset.title} v{obj.version} · {site.name} ({site.institution.name}) · "
            f"{rows} rows{shapley}"
        )


class JobSubmitForm(forms.Form):
    """What a researcher chooses to run: project, one dataset per site, columns and training knobs."""

    title = forms.CharField(
        max_length=200, help_text="A short name you will recognise in the job list."
    )
    project = ModelChoiceField(
        queryset=None, help_text="The job runs under this project's access grants and budget."
    )
    datasets = DatasetChoiceField(
        queryset=None,
        widget=forms.CheckboxSelectMultiple,
        help_text="Datasets your projects hold a valid grant for. Choose one per site, at least "
        "two. Contribution is measured as Shapley values only when every chosen dataset's data "
        "steward allows it (marked “Shapley values allowed”); otherwise every site is "
        "credited by data volume. With exactly two sites each can work out the other's model "
        "update from the global model (FedAvg between two parties, ADR 0036): choose three or "
        "more, or differential privacy, where that matters.",
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
        help_text="Federated rounds: each is local training at every site, then aggregation by "
        "the strategy.",
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

    # --- model and strategy (frp_flwr.models, frp_flwr.strategies) ---------------------------
    model_kind = forms.ChoiceField(
        label="Model",
        choices=[
            ("linear", "Logistic / linear regression"),
            ("mlp", "Multilayer perceptron (MLP)"),
            ("xgboost", "Gradient-boosted trees (XGBoost)"),
        ],
        initial="linear",
        required=False,
        help_text=" ".join(MODEL_HELP.values()),
    )
    mlp_hidden = forms.CharField(
        label="MLP hidden layers",
        required=False,
        max_length=64,
        initial="32",
        help_text="Units per hidden layer, comma-separated (e.g. 64,32): 1 to 4 layers of 1 to "
        "1024 units, at most 80,000 weights in all (the final model's limit).",
    )
    mlp_activation = forms.ChoiceField(
        label="MLP activation",
        choices=[("relu", "ReLU"), ("tanh", "tanh")],
        initial="relu",
        required=False,
        help_text="The hidden units' non-linearity.",
    )
    mlp_dropout = forms.FloatField(
        label="MLP dropout",
        required=False,
        initial=0.0,
        help_text="Share of hidden units dropped at random while training (0 to 0.9); 0: none.",
    )
    # XGBoost's hyper-parameters: type, default and range from frp_flwr.models.XGBOOST_PARAMS.
    xgb_local_rounds = _xgb_field(
        "local_rounds",
        "Local boosting rounds",
        "Trees each site adds per round (so a job grows rounds × sites × this many).",
    )
    xgb_max_depth = _xgb_field(
        "max_depth",
        "Max depth",
        "Deepest split of a tree; deeper trees fit more, and overfit sooner.",
    )
    xgb_eta = _xgb_field(
        "eta",
        "Learning rate (eta)",
        "Shrinkage of each tree's output; with several sites adding trees each round, "
        "a smaller eta (0.1) keeps their sum from overshooting.",
    )
    xgb_subsample = _xgb_field(
        "subsample",
        "Row subsample",
        "Share of a site's rows each tree is grown on.",
    )
    xgb_colsample_bytree = _xgb_field(
        "colsample_bytree",
        "Column subsample",
        "Share of the features each tree may split on.",
    )
    xgb_min_child_weight = _xgb_field(
        "min_child_weight",
        "Min child weight",
        "Least Hessian sum in a leaf (about the rows in it, for squared error).",
    )
    xgb_reg_lambda = _xgb_field(
        "reg_lambda",
        "L2 penalty (lambda)",
        "L2 regularisation of the leaf weights.",
    )

    strategy_name = forms.ChoiceField(
        label="Strategy",
        choices=[(k, LABELS[k]) for k in STRATEGIES],
        initial="fedavg",
        required=False,
        help_text="How the sites' updates are combined each round. FedProx keeps sites with "
        "different data close to the global model; FedAdam/FedYogi/FedAdagrad add a server-side "
        "optimiser; FedMedian, FedTrimmedAvg and Krum resist a faulty site.",
    )
    fedprox_mu = forms.FloatField(
        label="FedProx μ",
        required=False,
        initial=STRATEGIES["fedprox"][1]["mu"][1],
        help_text="Weight of the proximal term μ/2·‖w − w_global‖² in each site's training "
        "(0 to 100; 0 is FedAvg).",
    )
    server_eta = forms.FloatField(
        label="Server learning rate η",
        required=False,
        help_text="FedAdam/FedYogi/FedAdagrad: the server optimiser's step (0 to 10). Empty: "
        "Flower's default (0.1; FedYogi 0.01).",
    )
    server_eta_l = forms.FloatField(
        label="Site learning rate η_l",
        required=False,
        help_text="FedAdam/FedYogi/FedAdagrad: the sites' SGD step (replaces the learning rate "
        "above). Empty: the learning rate above.",
    )
    server_tau = forms.FloatField(
        label="Adaptivity τ",
        required=False,
        help_text="FedAdam/FedYogi/FedAdagrad: added to the root of the second moment (0 to 1). "
        "Empty: 0.001.",
    )
    server_beta_1 = forms.FloatField(
        label="Momentum β₁",
        required=False,
        help_text="FedAdam/FedYogi: first-moment decay in [0, 1). Empty: 0.9.",
    )
    server_beta_2 = forms.FloatField(
        label="Second moment β₂",
        required=False,
        help_text="FedAdam/FedYogi: second-moment decay in [0, 1). Empty: 0.99.",
    )
    trimmed_beta = forms.FloatField(
        label="Trimmed share β",
        required=False,
        initial=STRATEGIES["fedtrimmedavg"][1]["beta"][1],
        help_text="FedTrimmedAvg: share cut from each tail per coordinate, in [0, 0.5).",
    )
    krum_faulty = forms.IntegerField(
        label="Krum: faulty sites tolerated",
        required=False,
        initial=0,
        min_value=0,
        help_text="Krum: the number f of faulty sites to tolerate; needs more than 2f + 2 sites.",
    )

    #: Where a spec field's error shows on the form.
    SPEC_FIELDS = {
        "model.kind": "model_kind",
        "model.hidden": "mlp_hidden",
        "model.activation": "mlp_activation",
        "model.dropout": "mlp_dropout",
        **{f"model.{name}": f"xgb_{name}" for name in XGBOOST_PARAMS},
        "strategy.name": "strategy_name",
        "strategy.mu": "fedprox_mu",
        "strategy.eta_l": "server_eta_l",
        "strategy.eta": "server_eta",
        "strategy.tau": "server_tau",
        "strategy.beta_1": "server_beta_1",
        "strategy.beta_2": "server_beta_2",
        "strategy.beta": "trimmed_beta",
        "strategy.num_malicious_nodes": "krum_faulty",
    }

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

    def _spec_error(self, exc: Exception, default: str) -> None:
        text = str(exc)
        where = text.split(":", 1)[0]
        field = next(
            (
                f
                for key, f in sorted(self.SPEC_FIELDS.items(), key=lambda kv: -len(kv[0]))
                if where.startswith(key)
            ),
            default,
        )
        message = text.split(":", 1)[1].strip() if ":" in text else text
        self.add_error(
            field, message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")
        )

    def strategy_fields(self) -> list[tuple]:
        """``(bound field, "fedadam fedyogi …")``: each strategy parameter's field and the
        strategies that use it (the template shows it only for those)."""
        return [
            (self[field], " ".join(n for n, (_, params) in STRATEGIES.items() if key in params))
            for key, field in STRATEGY_FIELDS.items()
        ]

    def model_help(self) -> list[tuple[str, str]]:
        """``(model kind, help)`` of every model (``MODEL_HELP``)."""
        return list(MODEL_HELP.items())

    def xgboost_fields(self) -> list:
        """The bound fields of XGBoost's hyper-parameters (the template's trees fieldset)."""
        return [self[f"xgb_{name}"] for name in XGBOOST_PARAMS]

    def model_choice(self) -> dict | None:
        """The model spec from the model fields (``frp_flwr.models``); ``None`` (and inline
        errors) when a value does not fit."""
        kind = self.cleaned_data.get("model_kind") or "linear"
        raw: dict = {"kind": kind}
        if kind == "mlp":
            text = (self.cleaned_data.get("mlp_hidden") or "").strip()
            parts = [h.strip() for h in text.split(",") if h.strip()]
            # ASCII digits only: int() also reads "٣٢" (Arabic-Indic) and "1_0" as numbers
            if any(not (h.isascii() and h.isdigit()) for h in parts):
                self.add_error("mlp_hidden", "Give whole numbers separated by commas, e.g. 64,32.")
                return None
            hidden = [int(h) for h in parts] if text else None
            if hidden is not None:
                raw["hidden"] = hidden
            raw["activation"] = self.cleaned_data.get("mlp_activation") or "relu"
            dropout = self.cleaned_data.get("mlp_dropout")
            raw["dropout"] = MLP_DEFAULTS["dropout"] if dropout is None else dropout
        elif kind == "xgboost":  # an empty hyper-parameter field takes its default
            raw.update(
                {
                    name: self.cleaned_data[f"xgb_{name}"]
                    for name in XGBOOST_PARAMS
                    if self.cleaned_data.get(f"xgb_{name}") is not None
                }
            )
        try:
            return read_model_spec(raw)
        except ModelSpecError as exc:
            self._spec_error(exc, "model_kind")
            return None

    def strategy_choice(self) -> dict | None:
        """The strategy spec from the strategy fields (``frp_flwr.strategies``); empty fields
        take Flower's defaults (FedOpt's η_l: the learning rate); ``None`` on errors."""
        name = self.cleaned_data.get("strategy_name") or "fedavg"
        raw: dict = {"name": name}
        for key in STRATEGIES.get(name, ("", {}))[1]:
            value = self.cleaned_data.get(STRATEGY_FIELDS[key])
            if value is not None:
                raw[key] = value
        if name in ("fedadam", "fedyogi", "fedadagrad") and "eta_l" not in raw:
            raw["eta_l"] = self.cleaned_data.get("learning_rate") or 0.1
        try:
            return read_strategy_spec(raw)
        except StrategySpecError as exc:
            self._spec_error(exc, "strategy_name")
            return None

    def clean(self):
        cleaned = super().clean()
        cleaned["model"] = self.model_choice()
        cleaned["strategy"] = self.strategy_choice()
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
