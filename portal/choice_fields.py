"""Model choice form fields that refuse a key the database cannot hold, as a form error.

Django's ``ModelChoiceField`` and ``ModelMultipleChoiceField`` look a posted key up in the
database. A key beyond a 64-bit integer (``datasets=9223372036854775808``) made SQLite's driver
raise ``OverflowError`` there, which Django does not catch: a 500 for any signed-in user (issue 9,
finding 7). These subclasses answer such a key with the field's own "not one of the available
choices" error before any query. Every model choice field of the portal's forms is one of them.
"""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

#: The range of a 64-bit signed integer key (SQLite INTEGER, PostgreSQL bigint).
_KEY_MIN, _KEY_MAX = -(2**63), 2**63 - 1


def _out_of_range(value) -> bool:
    """True when ``value`` is an integer (as text or int) outside the 64-bit key range; anything
    else (empty, not a number, too many digits to parse) is left to Django's own checks."""
    try:
        key = int(str(value).strip())
    except ValueError:
        return False
    return not _KEY_MIN <= key <= _KEY_MAX


class ModelChoiceField(forms.ModelChoiceField):
    """``forms.ModelChoiceField`` with out-of-range keys refused as an invalid choice."""

    def to_python(self, value):
        if value not in self.empty_values and _out_of_range(value):
            raise ValidationError(self.error_messages["invalid_choice"], code="invalid_choice")
        return super().to_python(value)


class ModelMultipleChoiceField(forms.ModelMultipleChoiceField):
    """``forms.ModelMultipleChoiceField`` with out-of-range keys refused as invalid choices."""

    def _check_values(self, value):
        for key in value if isinstance(value, list | tuple) else ():
            if _out_of_range(key):
                raise ValidationError(
                    self.error_messages["invalid_choice"],
                    code="invalid_choice",
                    params={"value": str(key)[:40]},
                )
        return super()._check_values(value)
