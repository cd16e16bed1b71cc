"""Accounting admin registrations arrive with the accounting models."""
