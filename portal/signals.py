"""What the portal core tells the floors above it, without knowing who listens.

``site_revoked`` is sent (``sender=Site``, ``site=…``, ``by=…``) by ``portal.sites.site_revoke``
inside its transaction; the federation connects a receiver that unregisters the site's SuperNode
(after commit).
"""

from django.dispatch import Signal

site_revoked = Signal()
