"""Free ports for the servers the tests and the bench start, below the kernel's ephemeral range.

A port the kernel hands out for ``bind(0)`` comes from the same range it takes outgoing
connections' local ports from; between picking the port and the server binding it, one of the
process's own clients (Kopf, the emulator's, the load generator's) can take it, and the server
fails with "address already in use". Below that range only a listener can hold a port.
"""
from __future__ import annotations

import pathlib
import random
import socket

SPAN = 12_000   # ports tried below the ephemeral range


def free_ports(count: int, host: str = "") -> list[int]:
    """``count`` different ports free on ``host`` ("": every address) right now."""
    low = _ephemeral_low()
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(max(1024, low - SPAN), low)
        if port in ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        ports.append(port)
    return ports


def free_port(host: str = "") -> int:
    return free_ports(1, host)[0]


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
