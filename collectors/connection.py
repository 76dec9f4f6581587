"""Reaching a Ray cluster at an address, without Ray: a dead address fails in seconds, in one line.

Here rather than in ``collectors.backends.ray_``: the trainer names :class:`RayConnectError` without importing
the Ray plumbing (most runs never use Ray).
"""

from __future__ import annotations

import socket

CONNECT_TIMEOUT_S = 10.0  # for the cluster's port to answer: ray.init would retry a dead address for ever


class RayConnectError(ConnectionError):
    """No Ray cluster at the address given, or one that refuses this process (token authentication)."""


def check_answers(address: str) -> None:
    """``RayConnectError`` unless something listens at ``address``'s port within ``CONNECT_TIMEOUT_S``."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not port.isdigit():  # "auto", or a malformed address: Ray's own error says which
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise RayConnectError(f"no Ray cluster answers at {address} ({e}): start its head there (ray start --head "
                              f"--port={port}), or give the address that `ray start` printed (--ray-address)"
                              ) from None
