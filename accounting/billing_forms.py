"""Forms of billing: a pool's new price rule (institution admins)."""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.utils import timezone

from accounting.services.billing import billing_currency
from federation.models import ComputePool
from portal.choice_fields import ModelChoiceField


class PriceRuleForm(forms.Form):
    """A new price rule for one of the institution's pools, in Slurm TRESBillingWeights style."""

    pool = ModelChoiceField(
        queryset=None, help_text="The compute pool (of one of your sites) this price applies to."
    )
    effective_from = forms.DateField(
        label="Effective from",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="Jobs finishing on or after this day are billed at this rule, until a later "
        "rule starts. Today or later: prices are not changed retroactively.",
    )
    cpu_weight = forms.DecimalField(
        label="CPU weight (SU per core-hour)",
        min_value=Decimal(0),
        max_digits=12,
        decimal_places=6,
        initial=Decimal("1"),
        help_text="Service units per reserved core per hour of the job's wall time.",
    )
    memory_weight = forms.DecimalField(
        label="Memory weight (SU per GiB-hour)",
        min_value=Decimal(0),
        max_digits=12,
        decimal_places=6,
        initial=Decimal("0"),
        help_text="Service units per reserved GiB of memory per hour; e.g. 0.25 makes 4 GiB "
        "cost as much as one core.",
    )
    gpu_weight = forms.DecimalField(
        label="GPU weight (SU per GPU-hour)",
        min_value=Decimal(0),
        max_digits=12,
        decimal_places=6,
        initial=Decimal("0"),
        help_text="Service units per reserved GPU per hour.",
    )
    price_per_unit = forms.DecimalField(
        label="Price per service unit",
        min_value=Decimal(0),
        max_digits=12,
        decimal_places=4,
        help_text="What other institutions pay per service unit (up to 4 decimals); amounts "
        "are rounded half-up to cents.",
    )
    currency = forms.ChoiceField(
        choices=(),
        help_text="The federation bills in one currency, so an institution's monthly invoice "
        "has one currency.",
    )
    data_credit_rate = forms.DecimalField(
        label="Data credit rate",
        min_value=Decimal(0),
        max_value=Decimal(1),
        max_digits=5,
        decimal_places=4,
        initial=Decimal("0"),
        help_text="Share of a job's compute value on this pool that the submitting institution "
        "also pays to the data-providing institutions, split by their contribution shares (Shapley "
        "values, or data volume where a job measured none) (0.10 = 10 %; 0 = none).",
    )

    def __init__(self, *args, institution, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["pool"].queryset = (
            ComputePool.objects.filter(site__institution=institution)
            .select_related("site__institution")
            .order_by("name")
        )
        currency = billing_currency()
        self.fields["currency"].choices = [(currency, currency)]
        self.fields["currency"].initial = currency
        # ISO text: a date input shows nothing for a localised date
        self.fields["effective_from"].initial = timezone.localdate().isoformat()
        pools = list(self.fields["pool"].queryset[:2])
        if len(pools) == 1:
            self.fields["pool"].initial = pools[0].pk

    def clean_effective_from(self):
        """Refuse a past day here too, so the message shows with the other field errors (the
        service checks it again)."""
        day = self.cleaned_data["effective_from"]
        today = timezone.localdate()
        if day < today:
            raise forms.ValidationError(
                f"Choose today ({today:%Y-%m-%d}) or a later day: prices are not changed "
                "retroactively."
            )
        return day
