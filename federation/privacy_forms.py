"""The job form's privacy fieldset (prefix ``privacy``): differential privacy mode and settings.

Validation of shapes here; ε and the stewards' budgets in ``federation.privacy_budget``.
"""

from __future__ import annotations

from django import forms

DP_CHOICES = [
    ("off", "Off"),
    ("server", "Server-side clipping"),
    ("client", "Client-side clipping"),
]


class JobPrivacyForm(forms.Form):
    """Differential privacy of a job: Flower's fixed-clipping wrappers (ADR 0025)."""

    dp = forms.ChoiceField(
        choices=DP_CHOICES,
        initial="off",
        required=False,
        label="Differential privacy",
        widget=forms.RadioSelect,
        help_text="Server-side: the server clips each site's update, then adds noise to the "
        "average. Client-side: each site clips its own update before it leaves the site; the "
        "server adds the noise. Either way the model carries the stated (ε, δ) guarantee for any "
        "one site's data.",
    )
    noise_multiplier = forms.FloatField(
        required=False,
        min_value=0.01,
        max_value=1000,
        initial=1.0,
        label="Noise multiplier σ",
        help_text="Noise standard deviation over the clipping norm. Larger: smaller ε (more "
        "private), noisier model.",
    )
    clipping_norm = forms.FloatField(
        required=False,
        min_value=1e-6,
        max_value=1e6,
        initial=1.0,
        label="Clipping norm C",
        help_text="Largest L2 norm of a site's model update per round; larger updates are scaled "
        "down to it. The noise grows with C.",
    )
    delta = forms.FloatField(
        required=False,
        min_value=1e-12,
        max_value=0.1,
        initial=1e-5,
        label="δ",
        help_text="The probability the ε guarantee may fail; keep it well below 1 / number of "
        "sites.",
    )

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("prefix", "privacy")
        super().__init__(*args, **kwargs)

    def clean(self):
        cleaned = super().clean()
        cleaned["dp"] = cleaned.get("dp") or "off"
        if cleaned["dp"] == "off":
            return cleaned
        for name in ("noise_multiplier", "clipping_norm", "delta"):
            if cleaned.get(name) is None and name not in self.errors:
                self.add_error(name, "Required with differential privacy on.")
        return cleaned

    def privacy(self) -> dict:
        """The ``job-spec.privacy`` dict (``frp_flwr.contract.Privacy``) after ``is_valid``."""
        data = self.cleaned_data
        if data.get("dp", "off") == "off":
            return {"dp": "off"}
        return {
            "dp": data["dp"],
            "noise_multiplier": float(data["noise_multiplier"]),
            "clipping_norm": float(data["clipping_norm"]),
            "delta": float(data["delta"]),
        }
