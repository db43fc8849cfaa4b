"""Root pytest configuration: fixture plugins for the real test-bed servers.

Each plugin starts its server once per session, on first use, so a run that
selects only some tests starts only the servers those tests need.
"""

pytest_plugins = [
    "tests.fixtures_etcd",
    "tests.fixtures_brokers",
    "tests.fixtures_kube",
    "tests.fixtures_s3",
]
