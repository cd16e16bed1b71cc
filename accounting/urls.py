"""URLs of accounting: ledger proofs, invoices and institution billing, credit statements."""

from django.urls import path  # noqa: F401 — each part adds its routes below

app_name = "accounting"
urlpatterns: list = []

# --- ledger ----------------------------------------------------------------------------------
from accounting.views import ledger as ledger_views  # noqa: E402

urlpatterns += [
    path("ledger/", ledger_views.ledger_page, name="ledger"),
    path("ledger/checkpoint", ledger_views.ledger_checkpoint, name="ledger_checkpoint"),
    path("ledger/leaves/<int:index>", ledger_views.ledger_leaf, name="ledger_leaf"),
    path("ledger/proof/inclusion", ledger_views.ledger_inclusion, name="ledger_inclusion"),
    path("ledger/proof/consistency", ledger_views.ledger_consistency, name="ledger_consistency"),
    path("ledger/witnesses", ledger_views.ledger_witness_add, name="ledger_witness_add"),
    path("ledger/checkpoints/<int:size>/cosign", ledger_views.ledger_cosign, name="ledger_cosign"),
]

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
