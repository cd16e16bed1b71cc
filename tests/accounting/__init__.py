"""Tests for the accounting app: contribution math, Merkle log and signed checkpoints."""
