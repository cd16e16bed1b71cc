"""What the federation adds to pages of the floors below it (``portal.panels``): the dashboard's
recent jobs (its *Submit a job* button, count and table), each site's SuperNode (its kit, key and
the state of its SuperNodes) and compute pools on the institution's *Sites & pools* page, and the
airlock's pending model releases on the data steward's
queue. Registered in ``FederationConfig.ready()``.
"""

from __future__ import annotations

from federation import selectors
from portal import panels

RECENT_JOBS = 10


def _recent_jobs(request) -> list:
    """The user's ``RECENT_JOBS`` newest jobs, read once per request (two panels show them)."""
    if not hasattr(request, "_federation_recent_jobs"):
        request._federation_recent_jobs = selectors.accuracy_shown(
            selectors.jobs_for_user(user=request.user)[:RECENT_JOBS], user=request.user
        )
    return request._federation_recent_jobs


def dashboard_submit(*, request, projects) -> dict | None:
    """The *Submit a job* button, for a member of a project (``projects``: the user's)."""
    return {} if projects else None


def dashboard_jobs(*, request) -> dict:
    """The user's recent jobs (the count card and the table)."""
    return {"jobs": _recent_jobs(request)}


def site_pools(*, request, site) -> dict:
    """The compute pools of ``site``, by name."""
    return {"site": site, "pools": site.pools.order_by("name")}


def site_node(*, request, site) -> dict:
    """The site's SuperNode (its state loads by HTMX), its kit and the key form."""
    return {"site": site}


def site_supernodes(*, request, site) -> dict:
    """The SuperNode state of ``site`` (one Control API request per page, shared by its sites)."""
    if request is not None and hasattr(request, "_federation_supernodes"):
        states = request._federation_supernodes
    else:
        states = selectors.supernode_states()
        if request is not None:
            request._federation_supernodes = states
    return {
        "nodes": [n for n in states["nodes"] if n["site"] == site.slug],
        "error": states["error"],
        "show_site": False,
    }


def steward_releases(*, request) -> dict | None:
    """Pending model releases the signed-in data steward decides on (nothing when none)."""
    releases = selectors.releases_for_steward(user=request.user)
    return {"releases": releases} if releases else None


def register() -> None:
    """Fill the slots of the lower floors' pages."""
    panels.register(
        "dashboard.actions",
        template="federation/panels/dashboard_submit.html",
        context=dashboard_submit,
    )
    panels.register(
        "dashboard.stats", template="federation/panels/dashboard_stat.html", context=dashboard_jobs
    )
    panels.register(
        "dashboard.main", template="federation/panels/dashboard_jobs.html", context=dashboard_jobs
    )
    panels.register(
        "institution.site",
        template="federation/panels/site_node.html",
        context=site_node,
        order=50,
    )
    panels.register(
        "institution.site", template="federation/panels/site_pools.html", context=site_pools
    )
    panels.register(
        "institution.site",
        template="federation/panels/site_supernodes.html",
        context=site_supernodes,
        order=110,
    )
    panels.register(
        "steward_queue",
        template="federation/panels/steward_releases.html",
        context=steward_releases,
    )
