"""Makes the IdP fixtures (``tests.idp.fixtures``) available to the tests in this folder.

For the rest of the suite, load them once with ``pytest_plugins = ["tests.idp.fixtures"]`` in
``tests/conftest.py``. Registering the module as a plugin here too (rather than importing the
fixture functions) keeps a single definition, so each session-scoped IdP starts only once.
"""


def pytest_configure(config):
    config.pluginmanager.import_plugin("tests.idp.fixtures")  # no-op if already registered
