"""A node process exits cleanly on SIGTERM: drained, deregistered, status 0."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
from pathlib import Path

from headrace.cluster import Keys
from headrace.metastore.factory import open_metastore
from tests.node.harness import HANG_GUARD

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from headrace.node.server import NodeConfig, run_node
    config = NodeConfig(
        node_id="proc-node",
        metastore_url=sys.argv[1],
        cluster="proc",
        wal_backend="local",
        backend_settings={"root": sys.argv[2]},
    )
    asyncio.run(run_node(config))
    """
)


async def test_sigterm_stops_the_node_gracefully(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    metastore = await open_metastore(url)
    key = Keys("proc").node("proc-node")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SCRIPT, url, str(tmp_path / "wal")
    )
    try:
        async with asyncio.timeout(HANG_GUARD):
            while await metastore.get(key) is None:
                assert process.returncode is None, "the node process died while starting"
                await asyncio.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(HANG_GUARD):
            code = await process.wait()
        assert code == 0
        assert await metastore.get(key) is None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await metastore.close()
