"""Accounting models land with contribution, billing and the ledger (issue 5)."""
