"""Usage, contribution, billing and credit of finished jobs. Math modules import no Django."""
