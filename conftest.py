"""Root pytest configuration: fixture plugins for the real test-bed servers."""

pytest_plugins = ["tests.fixtures_etcd"]
