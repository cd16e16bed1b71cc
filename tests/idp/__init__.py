"""Real identity providers for the SSO tests: oidc-provider (OpenID Connect) and SimpleSAMLphp (SAML).

See README.md in this folder. Public API: ``tests.idp.oidc``, ``tests.idp.saml`` and the pytest
fixtures in ``tests.idp.fixtures``.
"""
