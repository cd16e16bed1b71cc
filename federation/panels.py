"""What the federation adds to pages of the floors below it (``portal.panels``): each site's
compute pools on the institution's *Sites & pools* page, and the airlock's pending model releases
on the data steward's queue. Registered in ``FederationConfig.ready()``.
"""

from __future__ import annotations

from federation import selectors
from portal import panels


def site_pools(*, request, site) -> dict:
    """The compute pools of ``site``, by name."""
    return {"site": site, "pools": site.pools.order_by("name")}


def steward_releases(*, request) -> dict | None:
    """Pending model releases the signed-in data steward decides on (nothing when none)."""
    releases = selectors.releases_for_steward(user=request.user)
    return {"releases": releases} if releases else None


def register() -> None:
    """Fill the slots of the lower floors' pages."""
    panels.register(
        "institution.site", template="federation/panels/site_pools.html", context=site_pools
    )
    panels.register(
        "steward_queue",
        template="federation/panels/steward_releases.html",
        context=steward_releases,
    )
