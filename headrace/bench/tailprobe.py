"""The tailing consumer of ``headrace bench node``, run as its own process.

``python -m headrace.bench.tailprobe URL VCHANNEL`` tails ``VCHANNEL`` from
"latest", prints ``ready`` once subscribed, then for every message reads the
send time the producer stamped into the first 8 bytes of the payload
(``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process on the
machine) and records the delay. When the parent writes the number of messages
it sent to stdin, the probe reads until it has that many (or none arrives for
5 s) and prints the delays in milliseconds as one JSON list.

A consumer in the producer's process would share its event loop and core, so
the measurement would include the producer's own queueing behind the
consumer's decoding; real consumers run elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import operator
import struct
import sys
import time

from headrace import runtime
from headrace.client.client import HeadraceClient

STAMP = struct.Struct("<q")


async def _read_expected() -> int:
    line = await asyncio.to_thread(sys.stdin.readline)
    return int(line.strip() or 0)


_payload_of = operator.attrgetter("message.payload")


async def probe(url: str, vchannel: str) -> list[float]:
    # While messages arrive, only each one's stamp is read (C calls over the
    # whole list) and kept with the delivery time of its ``next_many``; the
    # delays are computed once the run is over, not on the consumer's core
    # while it is being measured.
    received: list[tuple[int, list[tuple[int]]]] = []
    count = 0
    async with HeadraceClient(url) as client, client.consume(vchannel, start="latest") as consumer:
        print("ready", flush=True)
        expected_task = asyncio.create_task(_read_expected())
        while not expected_task.done() or count < expected_task.result():
            entries = await consumer.next_many(timeout=5)
            if not entries:
                if expected_task.done():
                    break
                continue
            now = time.monotonic_ns()
            received.append((now, list(map(STAMP.unpack_from, map(_payload_of, entries)))))
            count += len(entries)
        expected_task.cancel()
    return [(now - sent) / 1e6 for now, stamps in received for (sent,) in stamps]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m headrace.bench.tailprobe METASTORE_URL VCHANNEL", file=sys.stderr)
        return 2
    runtime.tune_process()
    delays = asyncio.run(probe(argv[0], argv[1]))
    print(json.dumps([round(d, 3) for d in delays]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
