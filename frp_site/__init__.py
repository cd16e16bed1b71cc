"""The site package: what an institution installs on its own host to join the federation.

Imports no Django. It holds the site operator's command-line tool (``frp-site``, ``frp_site.cli``),
the SuperNode's authentication key pair (``nodekey``), the site's configuration from its kit
(``config``), the SuperNode launch (``supernode``) and the one boundary to the portal's site API
(``portal_api``). The wheel built by ``scripts/build_site_wheel.py`` adds the Flower App
(``frp_flwr``) and the sandbox's site-side modules (crypto, keyring, storage, ingest, loader, …).
"""

__version__ = "0.1.0"
