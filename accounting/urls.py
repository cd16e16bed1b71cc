"""URLs of accounting: ledger proofs, invoices and institution billing, credit statements."""

from django.urls import path  # noqa: F401 — each part adds its routes below

app_name = "accounting"
urlpatterns: list = []

# --- ledger ----------------------------------------------------------------------------------

# --- billing ---------------------------------------------------------------------------------

# --- credit ----------------------------------------------------------------------------------
