"""The privacy accountant: a job's noise, sampling and rounds as ε at a stated δ (no Django).

A DP job (``frp_flwr.contract.Privacy``) runs ``rounds`` rounds of DP-FedAvg with fixed clipping:
every round each sampled site's update is clipped to L2 norm ``C`` and the average of ``n``
sampled sites gets Gaussian noise of standard deviation ``σ·C/n`` (Flower's fixed-clipping
wrappers; McMahan et al. 2018, arXiv:1710.06963). One round is a Gaussian mechanism with noise
multiplier ``σ`` on a site's contribution (site-level, add/remove-one-site adjacency), sampled
with probability ``q = sites sampled per round / sites``. The ε of ``rounds`` such rounds comes
from Google's ``dp-accounting`` (the privacy-loss-distribution accountant by default; Doroshenko
et al. 2022, "Connect the Dots: Tighter Discrete Approximations of Privacy Loss Distributions";
RDP for comparison, Mironov 2017). With q = 1 (every site every round, the portal's case) the
``pld`` accountant's answer is computed exactly instead: R rounds of the Gaussian mechanism are one
Gaussian mechanism of noise multiplier σ/√R (Dong, Roth & Su 2022, Corollary 3.3), whose ε at δ is
exact (Balle & Wang 2018, Theorem 8; ``dp_accounting.get_epsilon_gaussian``) and immediate for
every σ and R the form allows (the PLD grid grows with R/σ² and ran out of memory). The portal's
job form shows it before submission and the budget checks use it (ADR 0025).
"""

from __future__ import annotations

import math

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

#: Accountants by name: ``pld`` (tight; the portal's) and ``rdp`` (an upper bound).
ACCOUNTANTS = ("pld", "rdp")


class PrivacyError(ValueError):
    """Settings no accountant can turn into ε (the message says which and why)."""


def epsilon(
    *,
    noise_multiplier: float,
    rounds: int,
    delta: float,
    sampling_rate: float = 1.0,
    accountant: str = "pld",
) -> float:
    """ε after ``rounds`` rounds of the sampled Gaussian mechanism, at ``delta``.

    ``noise_multiplier``: σ, the noise standard deviation over the clipping norm (> 0);
    ``sampling_rate``: q in (0, 1], sites sampled per round over sites (1: every site every
    round, as this portal's ServerApp does); ``delta``: δ in (0, 1). Returns ε ≥ 0 (a float;
    ``math.inf`` never: σ > 0 always gives a finite ε). ``accountant``: ``pld`` or ``rdp``.
    Raises :class:`PrivacyError` for values out of range.
    """
    if not (isinstance(noise_multiplier, int | float) and noise_multiplier > 0):
        raise PrivacyError("The noise multiplier must be above 0.")
    if not math.isfinite(noise_multiplier):
        raise PrivacyError("The noise multiplier must be a finite number.")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise PrivacyError("The number of rounds must be 1 or more.")
    if not 0 < delta < 1:
        raise PrivacyError("δ must be between 0 and 1.")
    if not 0 < sampling_rate <= 1:
        raise PrivacyError("The sampling rate must be in (0, 1].")
    if accountant not in ACCOUNTANTS:
        raise PrivacyError(f"Unknown accountant {accountant!r}.")
    if sampling_rate == 1 and accountant == "pld":
        # R rounds of the Gaussian mechanism with σ are exactly one Gaussian mechanism with
        # σ/√R (Dong, Roth & Su 2022, Corollary 3.3); its ε is exact and immediate (Balle & Wang
        # 2018, Theorem 8). The PLD grid it replaces grows with R/σ²: σ = 0.01 over 100 rounds
        # asked for 76 GiB, σ = 0.3 over 100 rounds for 20 s and then a MemoryError.
        return max(
            0.0,
            float(dp_accounting.get_epsilon_gaussian(noise_multiplier / math.sqrt(rounds), delta)),
        )
    event: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sampling_rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(sampling_rate, event)
    event = dp_accounting.SelfComposedDpEvent(event, rounds)
    if accountant == "pld":
        acc = pld_privacy_accountant.PLDAccountant()
    else:
        acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(event)
    return max(0.0, float(acc.get_epsilon(delta)))


def job_epsilon(privacy: dict, *, rounds: int, sites_sampled: int, sites: int) -> float | None:
    """ε of one job's privacy settings (the ``job-spec.privacy`` dict), or ``None`` with dp off.

    ``sites_sampled`` of ``sites`` train each round (q = sampled / sites). Raises
    :class:`PrivacyError` for settings out of range."""
    if (privacy or {}).get("dp", "off") == "off":
        return None
    if sites < 1 or not 1 <= sites_sampled <= sites:
        raise PrivacyError("Sites sampled per round must be between 1 and the job's sites.")
    return epsilon(
        noise_multiplier=float(privacy.get("noise_multiplier", 0.0)),
        rounds=rounds,
        delta=float(privacy.get("delta", 0.0)),
        sampling_rate=sites_sampled / sites,
    )
