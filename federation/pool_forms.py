"""Forms of a compute pool's settings, edited by its institution's admins: resources, lending
calendar (weekly windows and dated exceptions), time-of-use price bands with demand-pricing
bounds, carbon-intensity source and power draw (issue 15 point 1), and the adapter that reads
capacity and health (static, or a Slurm partition: point 6)."""

from __future__ import annotations

from zoneinfo import available_timezones

from django import forms
from django.forms import inlineformset_factory

from federation.models import AvailabilityException, AvailabilityWindow, ComputePool, PriceBand
from federation.pool_adapters import PARTITION_RE


class ComputePoolForm(forms.ModelForm):
    class Meta:
        model = ComputePool
        fields = [
            "slots",
            "cores",
            "memory_gib",
            "gpus",
            "gpu_model",
            "time_zone",
            "always_available",
            "base_price",
            "currency",
            "cpu_weight",
            "memory_weight",
            "gpu_weight",
            "demand_pricing",
            "demand_elasticity",
            "price_floor",
            "price_cap",
            "carbon_source",
            "carbon_default",
            "carbon_provider",
            "carbon_zone",
            "watts_per_core",
            "watts_per_gpu",
            "adapter",
            "slurm_partition",
            "slurm_conf",
        ]
        help_texts = {
            "cpu_weight": "Service units per core-hour (Slurm TRESBillingWeights).",
            "memory_weight": "Service units per GiB-hour.",
            "gpu_weight": "Service units per GPU-hour.",
            "demand_elasticity": "How fast the price rises with queued demand: multiplier = "
            "1 + elasticity × (occupancy + backlog), kept between the bounds.",
            "price_floor": "Lowest price multiplier under demand pricing.",
            "price_cap": "Highest price multiplier under demand pricing.",
            "watts_per_core": "Power draw of one busy core, to turn metered CPU seconds into energy.",
            "watts_per_gpu": "Power draw of one busy GPU.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["adapter"].required = False  # absent: the static adapter

    def clean_adapter(self):
        return self.cleaned_data.get("adapter") or "static"

    def clean_time_zone(self):
        tz = self.cleaned_data["time_zone"]
        if tz not in available_timezones():
            raise forms.ValidationError("Not an IANA time zone, e.g. Europe/Berlin or UTC.")
        return tz

    def clean(self):
        cleaned = super().clean()
        lo, hi = cleaned.get("price_floor"), cleaned.get("price_cap")
        if lo is not None and hi is not None and lo > hi:
            self.add_error("price_cap", "The highest multiplier must not be below the lowest.")
        if cleaned.get("carbon_source") == "provider" and not (
            cleaned.get("carbon_provider") and cleaned.get("carbon_zone")
        ):
            self.add_error("carbon_zone", "A provider source needs a provider and a zone.")
        if cleaned.get("gpus") and not cleaned.get("gpu_model"):
            self.add_error("gpu_model", "Name the GPU model of the pool's GPUs.")
        if cleaned.get("adapter") == "slurm":
            partition = (cleaned.get("slurm_partition") or "").strip()
            if not partition:
                self.add_error("slurm_partition", "A Slurm pool needs the partition to read.")
            elif not PARTITION_RE.match(partition):
                self.add_error(
                    "slurm_partition",
                    "Letters, digits, dot, dash and underscore only, as in slurm.conf's "
                    "PartitionName.",
                )
            else:
                cleaned["slurm_partition"] = partition
        conf = (cleaned.get("slurm_conf") or "").strip()
        if conf and (not conf.startswith("/") or "\x00" in conf or ".." in conf.split("/")):
            self.add_error(
                "slurm_conf", "An absolute path without '..', e.g. /etc/slurm/slurm.conf."
            )
        return cleaned


class PoolCreateForm(ComputePoolForm):
    """A new pool of a site (``site`` given): its name and the settings of ``ComputePoolForm``;
    the calendars and carbon readings are edited on the pool's page afterwards."""

    class Meta(ComputePoolForm.Meta):
        fields = ["name", *ComputePoolForm.Meta.fields]
        help_texts = {
            **ComputePoolForm.Meta.help_texts,
            "name": "Unique within the site, e.g. cpu or gpu-a100.",
            "always_available": "Lent at all hours; otherwise only in the weekly windows you set "
            "on the pool's page after adding it.",
        }

    def __init__(self, *args, site, **kwargs):
        super().__init__(*args, **kwargs)
        self.site = site
        self.instance.site = site

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        if ComputePool.objects.filter(site=self.site, name=name).exists():
            raise forms.ValidationError(f"The site already has a pool named {name}.")
        return name


class _MinuteSpanForm(forms.ModelForm):
    """A weekly span entered as HH:MM times (stored as minutes from midnight)."""

    start = forms.TimeField(widget=forms.TimeInput(attrs={"type": "time"}), label="From")
    end = forms.TimeField(
        widget=forms.TimeInput(attrs={"type": "time"}),
        label="Until",
        help_text="00:00 means midnight at the end of the day.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            s, e = self.instance.start_minute, self.instance.end_minute
            self.initial.setdefault("start", f"{s // 60:02d}:{s % 60:02d}")
            self.initial.setdefault("end", f"{(e // 60) % 24:02d}:{e % 60:02d}")

    def clean(self):
        cleaned = super().clean()
        start, end = cleaned.get("start"), cleaned.get("end")
        if start is not None and end is not None:
            s = start.hour * 60 + start.minute
            e = end.hour * 60 + end.minute or 1440
            if e <= s:
                self.add_error(
                    "end", "Must be after the start (split a span over midnight in two)."
                )
            self.instance.start_minute, self.instance.end_minute = s, e
        return cleaned


class WindowForm(_MinuteSpanForm):
    class Meta:
        model = AvailabilityWindow
        fields = ["weekday", "start", "end", "foreign_only"]


class PriceBandForm(_MinuteSpanForm):
    class Meta:
        model = PriceBand
        fields = ["weekday", "start", "end", "price"]

    def clean_price(self):
        price = self.cleaned_data["price"]
        if price < 0:
            raise forms.ValidationError("A price cannot be negative.")
        return price


class ExceptionForm(forms.ModelForm):
    class Meta:
        model = AvailabilityException
        fields = ["start", "end", "available", "note"]
        widgets = {
            "start": forms.DateTimeInput(attrs={"type": "datetime-local"}),
            "end": forms.DateTimeInput(attrs={"type": "datetime-local"}),
        }

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("start") and cleaned.get("end") and cleaned["end"] <= cleaned["start"]:
            self.add_error("end", "Must be after the start.")
        return cleaned


WindowFormSet = inlineformset_factory(
    ComputePool, AvailabilityWindow, form=WindowForm, extra=2, can_delete=True
)
PriceBandFormSet = inlineformset_factory(
    ComputePool, PriceBand, form=PriceBandForm, extra=2, can_delete=True
)
ExceptionFormSet = inlineformset_factory(
    ComputePool, AvailabilityException, form=ExceptionForm, extra=1, can_delete=True
)


class CarbonCsvForm(forms.Form):
    file = forms.FileField(
        label="Carbon-intensity CSV",
        help_text="Columns datetime (ISO 8601 with offset, e.g. 2026-12-01T13:00+01:00) and "
        "g_per_kwh; one row per hour or finer. Rows replace readings at the same times.",
    )
