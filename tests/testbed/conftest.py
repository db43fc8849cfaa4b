"""Loads the Kubernetes test-bed fixtures (``kube_cluster``, ``kube_namespace``, ``helm_cli``).

They are registered once, as the plugin ``tests.fixtures_kube``, so every
directory that loads it this way (or the root ``pytest_plugins``) shares one
session cluster instead of each conftest getting its own.
"""

import pytest

PLUGIN = "tests.fixtures_kube"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)
