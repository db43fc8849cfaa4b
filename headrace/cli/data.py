"""``headrace produce`` and ``headrace consume``.

The commands import the client (which loads pyarrow) when they run, not with
this module, which every ``headrace`` process (a streaming node too) imports
to build its parser.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from typing import TYPE_CHECKING, TextIO

from headrace import errors
from headrace.cli.argtypes import non_negative_float, non_negative_int, positive_int
from headrace.cli.exits import exit_code_of
from headrace.cli.progress import Progress
from headrace.message import ids
from headrace.message.types import MessageType, validate_vchannel
from headrace.wal import registry
from headrace.wal.api import AppendResult

if TYPE_CHECKING:
    from headrace.client.consumer import Start


def add_produce_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--vchannel",
        required=True,
        action="append",
        help="target vchannel; repeat to spread messages round-robin",
    )
    p.add_argument("--count", type=non_negative_int, default=1000)
    p.add_argument("--size", type=non_negative_int, default=1024, help="payload bytes per message")
    p.add_argument("--type", default="INSERT", help="message type (default INSERT)")
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=256,
        help="messages in flight at once (default 256)",
    )
    p.add_argument(
        "--acks",
        metavar="FILE",
        default=None,
        help="write one JSON line per acknowledged message (index, vchannel, id, timetick, "
        "term) to FILE as it is acknowledged; '-' for stdout (the summary then goes to stderr)",
    )


def add_consume_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vchannel", required=True)
    p.add_argument(
        "--from",
        dest="start",
        default="earliest",
        help="earliest, latest, or a message id such as local:42 "
        "(local:42/3: the 4th message of the batch in record 42)",
    )
    p.add_argument(
        "--count", type=non_negative_int, default=0, help="stop after N data messages (0: never)"
    )
    p.add_argument(
        "--timeout",
        type=non_negative_float,
        default=0.0,
        help="stop when nothing arrives for this many seconds (0: wait forever)",
    )
    p.add_argument("--include-ticks", action="store_true", help="also print time ticks")


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    idx = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return sorted_values[idx]


def _open_acks(path: str | None) -> contextlib.AbstractContextManager[TextIO | None]:
    """The acknowledgement sink: None, stdout for '-', else FILE (created or
    truncated before anything is sent; InvalidArgument if it cannot be)."""
    if path is None:
        return contextlib.nullcontext()
    if path == "-":
        return contextlib.nullcontext(sys.stdout)
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise errors.InvalidArgument(
            f"--acks {errors.quoted(path)}: {exc.strerror or exc}"
        ) from None


def ack_line(index: int, vchannel: str, result: AppendResult) -> str:
    """One acknowledged message as a JSON line (pure)."""
    return json.dumps(
        {
            "index": index,
            "vchannel": vchannel,
            "id": str(result.id),
            "timetick": result.timetick,
            "term": result.term,
        }
    )


async def produce(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    vchannels = [validate_vchannel(v) for v in args.vchannel]
    mtype = MessageType.parse(args.type)
    await client_api.check_cluster(args.metastore, args.cluster)
    with _open_acks(args.acks) as acks:
        summary = await _produce(args, vchannels, mtype, acks)
    out = sys.stderr if args.acks == "-" else sys.stdout
    result = summary.report
    if args.json:
        print(json.dumps(result), file=out)
    else:
        print(" ".join(f"{k}={v}" for k, v in result.items()), file=out)
    return exit_code_of(summary.failures)


@dataclasses.dataclass(frozen=True, slots=True)
class ProduceSummary:
    report: dict[str, object]
    failures: tuple[errors.ErrorCode, ...]


async def _produce(
    args: argparse.Namespace, vchannels: list[str], mtype: MessageType, acks: TextIO | None
) -> ProduceSummary:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    progress = Progress("produce", args.count)
    latencies: list[float] = []
    failures: list[errors.ErrorCode] = []
    first_error: errors.HeadraceError | None = None
    async with client_api.HeadraceClient(args.metastore, cluster=args.cluster) as client:
        producer = client.producer()
        sem = asyncio.Semaphore(args.concurrency)
        payload = os.urandom(args.size)

        async def one(i: int) -> None:
            nonlocal first_error
            vchannel = vchannels[i % len(vchannels)]
            async with sem:
                t0 = time.perf_counter()
                try:
                    result = await producer.send(vchannel, payload, type=mtype)
                except errors.HeadraceError as exc:
                    failures.append(exc.code)
                    first_error = first_error or exc
                    return
                latencies.append((time.perf_counter() - t0) * 1000)
                if acks is not None:
                    acks.write(ack_line(i, vchannel, result) + "\n")
                progress.update(len(latencies) + len(failures))

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(args.count)))
        elapsed = time.perf_counter() - start
        await producer.close()
    progress.close()
    latencies.sort()
    acked = len(latencies)
    report: dict[str, object] = {
        "acked": acked,
        "failed": len(failures),
        "msgs_per_s": round(acked / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
    }
    if first_error is not None:
        report["first_error"] = str(first_error)
    return ProduceSummary(report, tuple(failures))


def parse_start(text: str) -> Start:
    if text == "earliest":
        return "earliest"
    if text == "latest":
        return "latest"
    registry.load_id_classes()
    return ids.parse(text)


async def consume(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    validate_vchannel(args.vchannel)
    start = parse_start(args.start)
    await client_api.check_cluster(args.metastore, args.cluster)
    progress = Progress("consume", args.count)
    seen = 0
    timeout = args.timeout if args.timeout > 0 else None
    types = list(MessageType) if args.include_ticks else None
    async with (
        client_api.HeadraceClient(args.metastore, cluster=args.cluster) as client,
        client.consume(args.vchannel, start=start, types=types) as consumer,
    ):
        while args.count == 0 or seen < args.count:
            entry = await consumer.next(timeout=timeout)
            if entry is None:
                break
            msg = entry.message
            is_data = not msg.type.is_system
            if is_data:
                seen += 1
                progress.update(seen)
            if not (is_data or args.include_ticks):
                continue
            row = {
                "id": str(entry.id),
                "vchannel": msg.vchannel,
                "timetick": msg.timetick,
                "type": msg.type.name,
                "size": len(msg.payload),
            }
            if args.json:
                print(json.dumps(row), flush=False)
            else:
                print(
                    f"{row['id']}\t{row['vchannel']}\t{row['timetick']}\t"
                    f"{row['type']}\t{row['size']}"
                )
    progress.close()
    if args.count and seen < args.count:
        raise errors.Unavailable(
            f"consumed {seen} of {args.count} messages before the {args.timeout}s timeout"
        )
    return 0
