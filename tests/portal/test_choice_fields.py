"""Model choice fields refuse keys beyond a 64-bit integer as a form error, before any query
(portal/choice_fields.py; issue 9, finding 7: ``datasets=9223372036854775808`` was a 500)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from portal.choice_fields import ModelChoiceField, ModelMultipleChoiceField
from portal.models import Institution

pytestmark = pytest.mark.django_db

TOO_LARGE = [str(2**63), str(-(2**63) - 1), "9" * 4000]


@pytest.mark.parametrize("key", TOO_LARGE)
def test_single_choice_refuses_a_key_out_of_range_without_a_query(key, django_assert_num_queries):
    field = ModelChoiceField(queryset=Institution.objects.all())
    with django_assert_num_queries(0), pytest.raises(ValidationError) as err:
        field.clean(key)
    assert err.value.code == "invalid_choice"


@pytest.mark.parametrize("key", TOO_LARGE)
def test_multiple_choice_refuses_a_key_out_of_range_without_a_query(key, django_assert_num_queries):
    field = ModelMultipleChoiceField(queryset=Institution.objects.all())
    with django_assert_num_queries(0), pytest.raises(ValidationError) as err:
        field.clean(["1", key])
    assert err.value.code == "invalid_choice"


def test_keys_in_range_are_still_looked_up():
    institution = Institution.objects.create(name="Edge", slug="edge")
    single = ModelChoiceField(queryset=Institution.objects.all())
    multiple = ModelMultipleChoiceField(queryset=Institution.objects.all())
    assert single.clean(str(institution.pk)) == institution
    assert list(multiple.clean([str(institution.pk)])) == [institution]
    with pytest.raises(ValidationError):
        single.clean(str(2**63 - 1))  # in range, no such row: Django's own error
