"""Accounting pages, one module per part: contribution, billing, credit, accounting steps."""
