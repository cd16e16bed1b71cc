"""Reads of accounting, one module per part: usage, contribution, billing, credit, steps."""
