"""URLs of the ledger page and its transparency-log API, included by ``portal.app_urls`` under
``ledger/`` in the ``portal`` namespace (``portal:ledger``, ``portal:ledger_inclusion``, …)."""

from django.urls import path

from portal.ledger import views

urlpatterns = [
    path("", views.ledger_page, name="ledger"),
    path("checkpoint", views.ledger_checkpoint, name="ledger_checkpoint"),
    path("leaves/<int:index>", views.ledger_leaf, name="ledger_leaf"),
    path("proof/inclusion", views.ledger_inclusion, name="ledger_inclusion"),
    path("proof/consistency", views.ledger_consistency, name="ledger_consistency"),
    path("witnesses", views.ledger_witness_add, name="ledger_witness_add"),
    path("checkpoints/<int:size>/cosign", views.ledger_cosign, name="ledger_cosign"),
]
