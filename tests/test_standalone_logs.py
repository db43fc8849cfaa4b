"""Node output reaches the node log, or the standalone's stderr when the log
cannot be written (a full disk): never lost silently."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from headrace.standalone import NodeLog, pump


def test_a_full_disk_diverts_node_output_to_stderr_with_a_notice() -> None:
    fallback = io.BytesIO()
    sink = NodeLog(Path("/dev/full"), "node-0", fallback)  # every write: ENOSPC
    sink.write(b"first line\n")
    sink.write(b"second line\n")
    sink.close()
    text = fallback.getvalue().decode()
    assert text.count("cannot write /dev/full (No space left on device)") == 1
    assert "[node-0] first line\n" in text and "[node-0] second line\n" in text
    assert sink.failure == "No space left on device"


def test_output_goes_to_the_log_file_and_back_after_a_failure(tmp_path: Path) -> None:
    fallback = io.BytesIO()
    path = tmp_path / "logs" / "node-1.log"
    sink = NodeLog(path, "node-1", fallback)
    sink.write(b"to the file\n")
    assert path.read_bytes() == b"to the file\n" and fallback.getvalue() == b""
    sink.close()
    sink.path = Path("/dev/full")
    sink.write(b"diverted\n")
    sink.close()
    sink.path = path
    sink.write(b"back\n")
    sink.close()
    assert path.read_bytes() == b"to the file\nback\n"
    text = fallback.getvalue().decode()
    assert "[node-1] diverted\n" in text and "works again" in text


async def test_pump_copies_everything_until_the_end() -> None:
    fallback = io.BytesIO()
    reader = asyncio.StreamReader()
    reader.feed_data(b"a" * 100_000 + b"\nlast\n")
    reader.feed_eof()
    sink = NodeLog(Path("/dev/full"), "node-2", fallback)
    await pump(reader, sink)
    copied = fallback.getvalue().split(b"its output follows here\n", 1)[1]
    assert copied.replace(b"[node-2] ", b"") == b"a" * 100_000 + b"\nlast\n"
