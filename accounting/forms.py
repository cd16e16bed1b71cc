"""Forms of the accounting pages, one section per part.

Forms only parse and check input; the services validate again and write.
"""

from __future__ import annotations

from decimal import Decimal

from django import forms

from accounting import credit
from accounting.models import ContributorKind

# --- credit ----------------------------------------------------------------------------------

PERCENT = Decimal("0.01")


def share_to_percent(share: float | None) -> Decimal | None:
    """A share in [0, 1] as a percentage with two decimals (the form's unit)."""
    if share is None:
        return None
    return (Decimal(repr(float(share))) * 100).quantize(PERCENT)


class CreditContributorForm(forms.Form):
    """One contributor row of the credit edit page: name, kind, CRediT roles, share in %."""

    id = forms.IntegerField(required=False, widget=forms.HiddenInput)
    name = forms.CharField(
        max_length=200,
        help_text="As it should appear in the paper, e.g. “Ada Lovelace” or “Hospital A”.",
    )
    kind = forms.ChoiceField(choices=ContributorKind.choices, initial=ContributorKind.PERSON)
    roles = forms.MultipleChoiceField(
        choices=[(r.slug, r.name) for r in credit.ROLES],
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Choose at least one role."},
    )
    share = forms.DecimalField(
        label="Share, %",
        required=False,
        min_value=0,
        max_value=100,
        decimal_places=2,
        help_text="Contribution share in per cent (0–100); leave empty if none.",
    )

    @property
    def linked(self) -> bool:
        """True for a row linked to a portal user or institution (its kind is fixed)."""
        return bool(self.initial.get("linked"))


class BaseCreditFormSet(forms.BaseFormSet):
    """The rows of a statement; ``rows()`` gives what ``credit_statement_update`` takes."""

    def clean(self):
        super().clean()
        if any(self.errors):
            return
        if not self.kept_forms():
            raise forms.ValidationError("A statement needs at least one contributor.")

    def kept_forms(self) -> list[CreditContributorForm]:
        """Filled-in rows not marked for removal, in page order."""
        kept = []
        for form in self.forms:
            data = getattr(form, "cleaned_data", None)
            if not data or (self.can_delete and data.get("DELETE")):
                continue
            if not form.has_changed() and not data.get("id"):
                continue  # an untouched blank row
            kept.append(form)
        return kept

    def rows(self) -> list[dict]:
        """``[{"id", "name", "kind", "roles", "share"}]`` with shares in [0, 1]; a share left as
        shown keeps its stored value exactly (the page rounds it to 0.01 %)."""
        rows = []
        for form in self.kept_forms():
            data = form.cleaned_data
            if "share" not in form.changed_data and "stored_share" in form.initial:
                share = form.initial["stored_share"]
            elif data["share"] is None:
                share = None
            else:
                share = float(data["share"] / 100)
            rows.append(
                {
                    "id": data.get("id"),
                    "name": data["name"],
                    "kind": data["kind"],
                    "roles": list(data["roles"]),
                    "share": share,
                }
            )
        return rows

    def add_service_errors(self, exc) -> None:
        """Put a ``CreditError``'s messages on the rows ``rows()`` came from."""
        forms_by_row = self.kept_forms()
        for i, fields in exc.row_errors.items():
            form = forms_by_row[i]
            for field, messages in fields.items():
                for message in messages:
                    # the id is a hidden field: its message goes on the row itself
                    shown = field in form.fields and not form.fields[field].widget.is_hidden
                    form.add_error(field if shown else None, message)
        if exc.errors:
            self._non_form_errors = self.error_class(
                list(self.non_form_errors()) + list(exc.errors)
            )


CreditFormSet = forms.formset_factory(
    CreditContributorForm, formset=BaseCreditFormSet, extra=1, can_delete=True, max_num=60
)


def credit_initial(lines) -> list[dict]:
    """Initial rows of the edit page from stored ``CreditLine``s."""
    return [
        {
            "id": line.pk,
            "name": line.name,
            "kind": line.kind,
            "roles": list(line.roles),
            "share": share_to_percent(line.share),
            "stored_share": line.share,
            "linked": line.user_id is not None or line.institution_id is not None,
        }
        for line in lines
    ]
