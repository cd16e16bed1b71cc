"""URLs of accounting: ledger proofs, invoices and institution billing, credit statements."""

from django.urls import path  # noqa: F401 — each part adds its routes below

app_name = "accounting"
urlpatterns: list = []

# --- ledger ----------------------------------------------------------------------------------

# --- billing ---------------------------------------------------------------------------------
from accounting.views import billing as billing_views  # noqa: E402

urlpatterns += [
    path("institutions/<slug:slug>/prices/", billing_views.prices, name="institution_prices"),
    path("institutions/<slug:slug>/billing/", billing_views.billing, name="institution_billing"),
    path("invoices/<int:pk>/", billing_views.invoice_detail, name="invoice_detail"),
    path("invoices/<int:pk>/invoice.csv", billing_views.invoice_csv, name="invoice_csv"),
]

# --- credit ----------------------------------------------------------------------------------
