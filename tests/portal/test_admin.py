"""The Django admin as the platform admin uses it: bad input is a form error, never a 500."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.factories import InstitutionFactory, MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def platform_admin(client):
    admin = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(admin)
    return admin


def _change_form(user) -> dict:
    return {
        "username": user.username,
        "email": user.email,
        "first_name": "",
        "last_name": "",
        "is_active": "on",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }


def test_saving_an_email_another_account_holds_in_another_case_is_a_form_error(
    client, platform_admin
):
    """Issue 9, finding 7: the case-insensitive unique index raised IntegrityError (a 500)."""
    UserFactory(email="ada@st-aurelia.example")
    other = UserFactory(email="other@example.org")

    response = client.post(
        f"/admin/auth/user/{other.pk}/change/",
        {**_change_form(other), "email": "ADA@St-Aurelia.example"},
    )

    assert response.status_code == 200
    assert "Another account already uses this e-mail address" in response.content.decode()
    assert get_user_model().objects.get(pk=other.pk).email == "other@example.org"


def test_saving_ones_own_email_in_another_case_is_allowed(client, platform_admin):
    user = UserFactory(email="ben@northfield.example")

    response = client.post(
        f"/admin/auth/user/{user.pk}/change/",
        {**_change_form(user), "email": "Ben@Northfield.example"},
    )

    assert response.status_code == 302
    assert (
        get_user_model().objects.get(pk=user.pk).email == "Ben@northfield.example"
    )  # domain normalised


def test_membership_form_with_a_junk_user_id_is_a_form_error(client, platform_admin):
    """Django's autocomplete widget queried the related table with the junk id (ValueError)."""
    institution = InstitutionFactory()
    membership = MembershipFactory(institution=institution)

    response = client.post(
        f"/admin/portal/membership/{membership.pk}/change/",
        {"user": "not-a-number", "institution": str(institution.pk), "role": "researcher"},
    )

    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()


# --- change lists of the big tables (issue 12) -------------------------------------------------


def test_large_table_checkbox_is_djangos_html(platform_admin):
    """``LargeTableMixin.action_checkbox`` writes the HTML Django's ``CheckboxInput`` renders,
    escaping included."""
    from django.contrib import admin

    from federation.models import FederatedJob
    from tests.factories import BillingJobFactory

    job = BillingJobFactory(title='<b>"Job" & co</b>')
    model_admin = admin.site._registry[FederatedJob]

    assert model_admin.action_checkbox(job) == admin.ModelAdmin.action_checkbox(model_admin, job)


@pytest.mark.parametrize(
    ("url", "wide"),
    [
        ("/admin/federation/federatedjob/", "final_metrics"),
        ("/admin/accounting/jobaccountingstep/", "final_metrics"),
        ("/admin/portal/auditevent/", '"data"'),
        ("/admin/sandbox/accessrequest/", "purpose"),
    ],
)
def test_big_change_lists_show_50_rows_without_their_wide_columns(
    client, platform_admin, url, wide
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.scale_world import build

    build(n_jobs=60, n_users=20, n_projects=4, n_datasets=10, rounds=1, months=1, tag="a")

    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)

    assert response.status_code == 200
    assert response.context["cl"].result_count > 50
    assert len(response.context["cl"].result_list) == 50
    listed = [q["sql"] for q in queries.captured_queries if "LIMIT 50" in q["sql"]]
    assert len(listed) == 1 and wide not in listed[0]


def test_retry_action_on_deferred_steps_queues_the_jobs_accounting(
    client, platform_admin, django_capture_on_commit_callbacks
):
    """The admin action gets the change list's rows (jobs' wide columns deferred)."""
    from accounting.models import JobAccountingStep, StepStatus
    from tests.scale_world import build

    build(n_jobs=20, n_users=12, n_projects=2, n_datasets=10, rounds=1, months=1, tag="r")
    failed = JobAccountingStep.objects.get(status=StepStatus.FAILED)  # job 0 of 20

    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(
            "/admin/accounting/jobaccountingstep/",
            {"action": "retry_accounting", "_selected_action": [str(failed.pk)]},
            follow=True,
        )

    assert response.status_code == 200
    assert f"Job #{failed.job_id}: queued billing" in response.content.decode()
    failed.refresh_from_db()
    assert failed.status == StepStatus.PENDING
    assert len(callbacks) == 1


def test_a_username_another_account_holds_in_another_case_is_a_form_error(client, platform_admin):
    """Hostile re-test C: "ada" and "Ada" made sign-in by username (case-insensitive) ambiguous."""
    UserFactory(username="ada")
    other = UserFactory(username="grace")

    response = client.post(
        f"/admin/auth/user/{other.pk}/change/", {**_change_form(other), "username": "Ada"}
    )

    assert response.status_code == 200
    assert "Another account already uses this username" in response.content.decode()
    assert get_user_model().objects.get(pk=other.pk).username == "grace"


def test_a_new_user_whose_username_differs_only_in_case_is_a_form_error(client, platform_admin):
    UserFactory(username="ada")

    response = client.post(
        "/admin/auth/user/add/",
        {"username": "ADA", "usable_password": "false", "password1": "", "password2": ""},
    )

    assert response.status_code == 200
    assert get_user_model().objects.filter(username__iexact="ada").count() == 1
