"""Tests of the core ledger (portal/ledger/), with the published vectors they check against."""
