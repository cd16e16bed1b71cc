"""Usage, contribution, ledger, billing and credit. Math modules import no Django."""
