"""Forms of the sandbox: access requests and the steward's decisions."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.utils import timezone

from portal.selectors import projects_for_user


class AccessRequestForm(forms.Form):
    project = forms.ModelChoiceField(queryset=None, help_text="The project that will use the data.")
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
        help_text="Approvals end at midnight UTC of this day.",
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

        return datetime.combine(day, time.min, tzinfo=UTC) + timedelta(days=1)
