"""A streaming node loads only what its path uses: no pyarrow (tens of MiB of
resident memory) unless it receives collection data, and no broker client
for a backend it does not run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from headrace.bench.node import PCHANNEL, VCHANNEL, _Cluster
from headrace.client.client import HeadraceClient

PIPELINE_ONLY = ("pyarrow", "pyiceberg", "confluent_kafka", "pulsar")
"""Modules a node on the local backend without collections has no use for."""

NODE_MODULES = (
    "headrace.node.server",
    "headrace.wal.framework",
    "headrace.wal.local",
    "headrace.metastore.sqlite",
    "headrace.coordinator.writestop",
)


def loaded_after(imports: str) -> list[str]:
    """Which of :data:`PIPELINE_ONLY` a fresh interpreter holds after ``imports``."""
    script = textwrap.dedent(
        f"""
        import json, sys
        {imports}
        print(json.dumps([m for m in {PIPELINE_ONLY!r} if m in sys.modules]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=120
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_the_node_modules_do_not_load_pyarrow_or_broker_clients() -> None:
    assert loaded_after("; ".join(f"import {m}" for m in NODE_MODULES)) == []


def test_collection_data_still_loads_pyarrow_where_it_is_checked() -> None:
    # The variant: the node's segment checks need the payload code, which loads it.
    assert loaded_after("from headrace.table import payloads") == ["pyarrow"]


def test_the_node_command_builds_its_parser_without_the_client() -> None:
    # Every `headrace` process builds the whole parser, a node's too.
    assert loaded_after("from headrace.cli import main; main.build_parser()") == []


async def test_a_node_process_serving_a_pchannel_has_not_loaded_pyarrow(tmp_path: Path) -> None:
    node_cluster = _Cluster(tmp_path)
    await node_cluster.start()
    try:
        async with HeadraceClient(node_cluster.url) as client:
            await client.wait_ready(PCHANNEL, timeout=60)
            async with client.producer() as producer:
                await producer.send(VCHANNEL, b"x")
            assert node_cluster.proc is not None
            maps = await asyncio.to_thread(Path(f"/proc/{node_cluster.proc.pid}/maps").read_text)
    finally:
        await node_cluster.close()
    assert "libarrow" not in maps, "the node process mapped pyarrow's libraries"
    assert "libparquet" not in maps
