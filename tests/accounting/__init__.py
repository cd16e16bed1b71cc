"""Tests for the accounting app: usage, contribution, billing and credit of finished jobs."""
