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

# --- credit ----------------------------------------------------------------------------------
