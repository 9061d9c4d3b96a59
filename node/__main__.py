"""python -m floering.node --node-id n0 --listen 127.0.0.1:7000 --peers n0=127.0.0.1:7000,..."""

from __future__ import annotations

import asyncio
import os
import sys

from floering.node.app import serve
from floering.node.config import load_config
from floering.wire.errors import InvalidArgument, UnknownReducer
from floering.node.logs import configure_logging
from floering.node.transport.binding import PortInUse
from floering.node.transport.server import node_tls


def main(argv=None) -> int:
    os.umask(0o077)                 # its data, logs and events: the owner's only, from birth
    try:
        config = load_config(argv)
        if not config.tls_dir and not config.insecure:
            raise ValueError("no --tls-dir: give one (mutual TLS), or --insecure to serve "
                             "in the clear (loopback only)")
        node_tls(config)            # refuses the clear beyond loopback, reads the certificates
    except (ValueError, OSError) as exc:
        print(f"floe node: bad configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.node_id, config.log_level, config.log_format)
    try:
        asyncio.run(serve(config))
    except (UnknownReducer, InvalidArgument) as exc:     # e.g. a reducer the balancer cannot use
        print(f"floe node: {exc}", file=sys.stderr)
        return 2
    except PortInUse as exc:                             # another process holds the port
        print(f"floe node: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
