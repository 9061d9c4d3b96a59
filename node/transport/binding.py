"""A node's port is its own: the server binds it exclusively, and a second process on
a bound port fails to start with one line naming the port.

gRPC sets SO_REUSEPORT on its listening sockets by default, so a second server on a
node's port (a duplicate `floe node`, or anyone on the host) would bind beside it
without an error and take part of the new connections. `SERVER_OPTIONS` turns that
off; `claim_port` finds a port in use before gRPC tries it (gRPC would only log
its own error and raise a RuntimeError)."""

from __future__ import annotations

import errno
import socket

SERVER_OPTIONS = [("grpc.so_reuseport", 0)]


class PortInUse(OSError):
    """The listen address's port is bound by another process."""


def _host_port(listen: str) -> tuple[str | None, int] | None:
    host, _, port = listen.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        return None
    return (host.strip("[]") or None), number


def in_use(listen: str) -> PortInUse:
    parts = _host_port(listen)
    port = parts[1] if parts else listen
    error = PortInUse(f"cannot listen on {listen}: port {port} is in use (another "
                      f"process, another node perhaps, is bound to it)")
    error.errno = errno.EADDRINUSE
    return error


def claim_port(listen: str) -> None:
    """Raise PortInUse when a socket is bound to `listen`'s port (on any address it
    resolves to). Bound as gRPC binds (SO_REUSEADDR: connections of a process just
    gone, in TIME_WAIT, do not make the port busy); port 0 is always free."""
    parts = _host_port(listen)
    if parts is None or parts[1] == 0:
        return
    host, port = parts
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return                       # gRPC reports an address it cannot resolve
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:
            continue                 # e.g. no IPv6 on this host
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise in_use(listen) from None
