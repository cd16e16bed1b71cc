"""Multifactor job priority in the manner of Slurm's ``priority/multifactor`` plugin.

``priority = w_age·age + w_fairshare·fairshare + w_size·size + w_qos·qos`` (each factor in [0, 1],
rounded to an integer), after https://slurm.schedmd.com/priority_multifactor.html:

- age: time queued ÷ ``max_age_s``, capped at 1 (``PriorityMaxAge``);
- job size: the job's cores ÷ the cores of the pools it asks for, capped at 1 (large jobs first,
  Slurm's default without ``PriorityFavorSmall``);
- QoS: the job's QoS level ÷ the highest level;
- fair share, the classic algorithm over a two-level tree (institution → project):
  normalised shares ``S = S_inst/ΣS_inst × S_proj/ΣS_proj(siblings)``; normalised usage ``U`` =
  decayed usage ÷ all decayed usage; effective usage
  ``UE_child = U_child + (UE_parent − U_child) × S_child/S_siblings`` with ``UE_root = 1`` when
  there is any usage (else 0); factor ``F = 2^(−UE/S)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from federation.scheduling.model import QOS_LEVELS, Account, Job, Pool, Weights


def decayed_usage(records: Iterable[tuple[float, float]], *, now_s: float, half_life_s: float):
    """Σ usage × 2^(−age/half_life) over ``(time_s, amount)`` records (``PriorityDecayHalfLife``).

    Records in the future count fully. Returns a ``float`` in the records' unit.
    """
    total = 0.0
    for time_s, amount in records:
        age = max(0.0, now_s - time_s)
        total += amount * 2.0 ** (-age / half_life_s)
    return total


def fairshare_factors(
    accounts: Mapping[str, Account], institution_shares: Mapping[str, float]
) -> dict[str, float]:
    """Project → classic fair-share factor ``2^(−UE/S)`` in (0, 1] (module docstring).

    An institution missing from ``institution_shares`` has one share; a project with zero shares
    (or whose institution has zero) gets factor 0.
    """
    insts: dict[str, list[str]] = {}
    for name, acc in accounts.items():
        insts.setdefault(acc.institution, []).append(name)
    inst_share = {i: float(institution_shares.get(i, 1.0)) for i in insts}
    total_share = sum(inst_share.values()) or 1.0
    total_usage = sum(a.usage for a in accounts.values())
    root_ue = 1.0 if total_usage > 0 else 0.0
    out: dict[str, float] = {}
    for inst, projects in insts.items():
        s_inst = inst_share[inst] / total_share
        u_inst = sum(accounts[p].usage for p in projects) / total_usage if total_usage else 0.0
        ue_inst = u_inst + (root_ue - u_inst) * s_inst
        proj_total = sum(accounts[p].shares for p in projects) or 1.0
        for p in projects:
            s_rel = accounts[p].shares / proj_total
            s_norm = s_inst * s_rel
            u_p = accounts[p].usage / total_usage if total_usage else 0.0
            ue_p = u_p + (ue_inst - u_p) * s_rel
            out[p] = 2.0 ** (-ue_p / s_norm) if s_norm > 0 else 0.0
    return out


def job_priority(
    job: Job,
    *,
    now_s: float,
    pools: Mapping[int, Pool],
    fairshare: Mapping[str, float],
    weights: Weights,
) -> int:
    """The job's integer priority (module docstring); unknown projects get fair share 0."""
    age = min(max(0.0, now_s - job.submitted_s) / weights.max_age_s, 1.0)
    want = sum(r.cores for r in job.demands.values())
    have = sum(pools[p].capacity.cores for p in job.demands if p in pools)
    size = min(want / have, 1.0) if have else 0.0
    top = max(QOS_LEVELS.values())
    qos = QOS_LEVELS.get(job.qos, QOS_LEVELS["normal"]) / top
    fs = fairshare.get(job.project, 0.0)
    return round(
        weights.age * age + weights.fairshare * fs + weights.size * size + weights.qos * qos
    )
