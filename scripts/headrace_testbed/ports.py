"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports that were free a moment ago.

    All sockets stay bound until every port is chosen, so the ports differ from
    each other; another process may still take one before the caller binds it,
    so callers retry a start that fails with "address in use".
    """
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def free_port(host: str = LOOPBACK) -> int:
    return free_ports(1, host)[0]
