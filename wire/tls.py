"""The TLS files a ring's members and clients present, and the names servers are
dialled under: the part of the ring's TLS that node and client share. Issuing,
rotating and checking certificates is the node's (node.transport.tls)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import grpc

ROLES = ("node", "client", "operator")
NODE_ROLE_NAME = "node.floe-ring"      # every node certificate's server name
_LABEL = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def server_name(node_id: str) -> str:
    """The DNS name a node's certificate carries for it, and that callers dial it
    under: `n2.node.floe-ring` for `n2` and its later members (`n2#1`). An id that is
    not a lowercase DNS label (hostnames compare without case) is named by its hash
    (`h--<hex>.node.floe-ring`: a plain label never holds `--`)."""
    base = node_id.split("#", 1)[0]
    if len(base) > 63 or not _LABEL.fullmatch(base):
        base = "h--" + hashlib.sha256(base.encode()).hexdigest()[:40]
    return f"{base}.{NODE_ROLE_NAME}"


@dataclass(frozen=True)
class TlsFiles:
    """The CA certificate and one certificate with its key, as PEM files."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, directory: str | Path, name: str) -> "TlsFiles":
        """`name`'s files in a directory `generate` wrote (`n0`, `client`, ...)."""
        d = Path(directory)
        files = cls(d / "ca.pem", d / f"{name}.pem", d / f"{name}.key")
        for path in (files.ca, files.cert, files.key):
            if not path.is_file():
                raise FileNotFoundError(f"TLS file {path} is missing")
        return files

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.ca.read_bytes(), require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca.read_bytes(),
                                            private_key=self.key.read_bytes(),
                                            certificate_chain=self.cert.read_bytes())
