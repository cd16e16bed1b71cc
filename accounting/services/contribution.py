"""Writes of contribution scores: Shapley values of each site from the posted coalition utilities.

The ServerApp rebuilds coalition models from the logged rounds and the sites score them (ADR 0010);
``job.final_metrics["contribution"]`` holds the utilities (see
``federation.services._record_contribution``). Here the math of ``accounting.contribution`` turns
them into one ``ContributionScore`` per site and method: exact Shapley (whole run, and per round
when the rounds were scored) for up to ``EXACT_MAX_SITES`` sites, GTG-Shapley above, leave-one-out
as a cross-check, and — when the job's updates were hidden (secure aggregation) — data volume only.
The constant and the coalition keys are the ServerApp's own (``frp_flwr.coalitions``, the plan it
scored).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from django.db import transaction

from accounting.contribution import exact_shapley, gtg_shapley, leave_one_out, normalise
from accounting.models import ContributionMethod, ContributionScore
from accounting.selectors.contribution import released_volume, volume_basis, volume_rounds
from federation.disclosure import contribution_released
from federation.models import FederatedJob
from frp_flwr.coalitions import EXACT_MAX_SITES, coalition_key
from portal.ledger.leaves import commitment
from portal.ledger.services import ledger_append
from portal.services import audit_record

#: Round number under which whole-run scores are stored.
WHOLE_RUN = 0


class ContributionError(Exception):
    """The posted utilities cannot be turned into scores (missing coalition, unknown site)."""


def table_utility(table: dict[str, float]) -> Callable[[frozenset[int]], float]:
    """A utility over a table of coalition key (``"0,2"``; ``""`` = ∅) → value.

    Raises ``ContributionError`` naming the coalition when the table lacks it.
    """

    def utility(coalition: frozenset[int]) -> float:
        try:
            return float(table[coalition_key(coalition)])
        except KeyError:
            raise ContributionError(
                f"no utility for coalition {{{coalition_key(coalition)}}} was reported"
            ) from None

    return utility


def _hidden(job: FederatedJob) -> bool:
    return bool(volume_basis(job))


Scores = tuple[str, int, list[str], np.ndarray, np.ndarray, int]


def _scores(job: FederatedJob) -> list[Scores]:
    """``(method, round, players, raw values, share basis, evaluations)`` for every score set of
    ``job``; shares are :func:`normalise` of the basis. The basis is the raw values, except for
    data volume: a site's exact training examples are its raw value, and the sum of its rounds'
    released rows (``released_volume``) its basis, so a share tells no more than the released
    counts (issue 9, finding 5)."""
    if _hidden(job):
        volumes = volume_rounds(job=job)
        players = sorted(volumes)
        raw = np.array([float(sum(volumes[p])) for p in players])
        basis = np.array([float(released_volume(volumes[p])) for p in players])
        return (
            [(ContributionMethod.DATA_VOLUME, WHOLE_RUN, players, raw, basis, 0)] if players else []
        )
    posted = job.final_metrics.get("contribution") or {}
    if not posted or posted.get("error"):
        return []
    players = list(posted["players"])
    n = len(players)
    # Scored from the utilities as released (federation.disclosure.site_fraction): a utility is
    # a fraction over a site's held-out rows, and Shapley values of exact ones, in the ledger
    # every institution reads, would give the counts back (issue 9). At most half a held-out
    # row of the smallest site moves. (A site of 1–7 rows: data volume, ``volume_basis``.)
    tables = contribution_released(posted, exact=False).get("utilities") or {}
    run = table_utility(tables.get(str(WHOLE_RUN), {}))
    out = []
    if n <= EXACT_MAX_SITES:
        values = exact_shapley(n, run)
        out.append((ContributionMethod.EXACT, WHOLE_RUN, players, values, values, 1 << n))
        for rnd in sorted(int(r) for r in tables if int(r) != WHOLE_RUN):
            values = exact_shapley(n, table_utility(tables[str(rnd)]))
            out.append((ContributionMethod.EXACT, rnd, players, values, values, 1 << n))
    else:
        for rnd in sorted(int(r) for r in tables):
            estimate = gtg_shapley(
                n,
                table_utility(tables[str(rnd)]),
                seed=int(posted.get("seed", 0)),
                max_permutations=int(posted.get("permutations") or 0) or None,
            )
            values = estimate.values
            out.append((ContributionMethod.GTG, rnd, players, values, values, estimate.evaluations))
    loo = leave_one_out(n, run)
    out.append((ContributionMethod.LOO, WHOLE_RUN, players, loo, loo, n + 1))
    return out


def contribution_score_job(*, job: FederatedJob) -> list[ContributionScore]:
    """Score every site's contribution to ``job`` from the utilities its ServerApp posted.

    Methods (``ContributionMethod``), each stored per site with ``raw_value`` in utility units
    (median over the sites of held-out accuracy, 0..1) and ``share`` = :func:`normalise` of the
    raws (for data volume, of the released counts):

    * ``exact`` — Shapley (1953) by enumeration over all ``2^n`` coalitions,
      ``n <= EXACT_MAX_SITES`` (8); round 0 is the whole run (raws sum to v(N) − v(∅),
      efficiency), rounds 1..T when per-round utilities were posted (v_t(∅) = the round's
      starting model);
    * ``gtg`` — GTG-Shapley (Liu et al. 2022) above ``EXACT_MAX_SITES`` sites, on the coalitions
      the ServerApp scored (prefixes of the same guided permutations, same seed and permutation
      budget); for the whole run and for each round whose utilities were posted;
    * ``loo`` — leave-one-out v(N) − v(N∖{i}), the cross-check;
    * ``data_volume`` — training examples per site (``raw_value``, exact), its ``share``
      computed from the rounds' released rows (``released_volume``: the profile's rule, not the
      exact counts, which a share would give back to anyone knowing one site's), used alone when
      ``job.final_metrics["updates_hidden"]`` says individual updates were hidden (secure
      aggregation), or the job trained bagged trees (``job.model == "xgboost"``, ADR 0023):
      no coalition model can be rebuilt (:func:`volume_basis`).

    Idempotent and safe to call twice (a lock on the job row, one row per job, site, method and
    round): a score is appended to the ledger (``kind="contribution"``) when first created, and
    again only when its figures changed (a job resumed from its checkpoint is scored again on its
    completed run: the row is updated and the new figures get a new leaf, the earlier leaf
    stays). A second call with the same data writes nothing. Returns the job's scores (empty when
    no utilities were posted, or the evaluation reported an error).

    Raises ``ContributionError`` when a needed coalition utility is missing or a player is not a
    site of the job (nothing is written then).
    """
    with transaction.atomic():
        job = FederatedJob.objects.select_for_update().get(pk=job.pk)
        sites = {js.site.slug: js.site for js in job.sites.select_related("site__institution")}
        results = _scores(job)
        for _, _, players, *_ in results[:1]:
            unknown = [p for p in players if p not in sites]
            if unknown:
                raise ContributionError(f"contribution names sites outside the job: {unknown}")
        scores, created_any, salts, volume = [], False, {}, {}
        for method, rnd, players, raw, basis, evaluations in results:
            shares = normalise(basis)
            for slug, value, share in zip(players, raw, shares, strict=True):
                values = {
                    "raw_value": float(value),
                    "share": float(share),
                    "evaluations": evaluations,
                }
                score = ContributionScore.objects.filter(
                    job=job, site=sites[slug], method=method, round=rnd
                ).first()
                changed = score is None or any(getattr(score, k) != v for k, v in values.items())
                if score is None:
                    score = ContributionScore.objects.create(
                        job=job, site=sites[slug], method=method, round=rnd, **values
                    )
                elif changed:
                    # Measured again (a resumed job's completed run): the row shows the new
                    # figures, and the ledger gets a new leaf; the earlier leaf stays.
                    for k, v in values.items():
                        setattr(score, k, v)
                    score.save(update_fields=list(values))
                if changed:
                    created_any = True
                    record = {
                        "job": job.pk,
                        "site": slug,
                        "method": str(method),
                        "round": rnd,
                        "raw_value": repr(float(value)),
                        "share": repr(float(share)),
                        "evaluations": evaluations,
                    }
                    if method == ContributionMethod.DATA_VOLUME:
                        # A data-volume raw value is the site's training examples (rounds ×
                        # rows): every institution reads the ledger, so only a salted
                        # commitment goes in, as for usage (issue 9, finding 5); the figure
                        # and its salt stay in the score and the audit event.
                        del record["raw_value"]
                        record["raw_value_commitment"], salts[slug] = commitment(repr(float(value)))
                        volume[slug] = value
                    ledger_append(kind="contribution", record=record)
                scores.append(score)
        if created_any:  # a second call writes nothing, not even an audit event
            audit_record(
                by=None,
                action="contribution.score",
                target=job,
                institution=job.project.institution,
                methods=sorted({str(m) for m, *_ in results}),
            )
        for slug, salt in salts.items():  # each site's salt for its own parties (as usage's)
            audit_record(
                by=None,
                action="contribution.data_volume",
                target=job,
                institution=sites[slug].institution,
                site=slug,
                raw_value=repr(float(volume[slug])),
                raw_value_salt=salt,
            )
        return scores
