"""URLs of accounting: prices, invoices and institution billing, credit statements, the jobs
whose accounting failed and their retry."""

from django.urls import path  # noqa: F401 — each part adds its routes below

app_name = "accounting"
urlpatterns: list = []

# --- billing ---------------------------------------------------------------------------------
from accounting.views import billing as billing_views  # noqa: E402

urlpatterns += [
    path("institutions/<slug:slug>/prices/", billing_views.prices, name="institution_prices"),
    path("institutions/<slug:slug>/billing/", billing_views.billing, name="institution_billing"),
    path("invoices/<int:pk>/", billing_views.invoice_detail, name="invoice_detail"),
    path("invoices/<int:pk>/invoice.csv", billing_views.invoice_csv, name="invoice_csv"),
]

# --- credit ----------------------------------------------------------------------------------

from accounting.views import credit as credit_views  # noqa: E402

urlpatterns += [
    path("credit/jobs/<int:pk>/", credit_views.statement, name="credit_statement"),
    path("credit/jobs/<int:pk>/credit.json", credit_views.statement_json, name="credit_json"),
    path("credit/jobs/<int:pk>/credit.txt", credit_views.statement_text, name="credit_text"),
    path("credit/jobs/<int:pk>/draft/", credit_views.statement_draft, name="credit_draft"),
    path("credit/jobs/<int:pk>/edit/", credit_views.statement_edit, name="credit_edit"),
]

# --- accounting steps ------------------------------------------------------------------------

from accounting.views import steps as steps_views  # noqa: E402

urlpatterns += [
    path("jobs/", steps_views.failures, name="accounting_failures"),
    path(
        "institutions/<slug:slug>/jobs/",
        steps_views.institution_failures,
        name="institution_accounting",
    ),
    path("jobs/<int:pk>/retry/", steps_views.retry, name="job_accounting_retry"),
]
