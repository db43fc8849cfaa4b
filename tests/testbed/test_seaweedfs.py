"""The SeaweedFS test bed: a real S3 endpoint on loopback that checks signatures."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from headrace_testbed.seaweedfs import Credentials, bucket_visible, mini_command
from tests.fixtures_s3 import S3Store


def test_mini_command_binds_every_port_to_loopback() -> None:
    ports = {"s3.port": 1001, "admin.port": 1002, "admin.port.grpc": 11002}
    command = mini_command(Path("/bin/weed"), Path("/d"), "b", ports)
    assert command[:2] == ["/bin/weed", "mini"]
    assert "-ip.bind=127.0.0.1" in command
    assert {"-s3.port=1001", "-admin.port=1002", "-admin.port.grpc=11002"} <= set(command)
    assert {"-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-bucket=b"} <= set(command)


@pytest.mark.s3
def test_the_store_serves_its_bucket_and_refuses_other_keys(s3_store: S3Store) -> None:
    assert s3_store.endpoint.startswith("http://127.0.0.1:")
    good = Credentials(s3_store.access_key, s3_store.secret_key)
    assert bucket_visible(s3_store.endpoint, s3_store.bucket, good)
    assert not bucket_visible(s3_store.endpoint, s3_store.bucket, Credentials("x", "y"))
    filesystem = pafs.S3FileSystem(
        access_key=s3_store.access_key,
        secret_key=s3_store.secret_key,
        endpoint_override=s3_store.endpoint,
        scheme="http",
        region="us-east-1",
    )
    path = f"{s3_store.bucket}/testbed/roundtrip.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), path, filesystem=filesystem)
    assert pq.read_table(path, filesystem=filesystem).column("a").to_pylist() == [1, 2, 3]
