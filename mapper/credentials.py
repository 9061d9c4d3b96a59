"""Where a client's TLS certificates come from, in one order for every `floe` command
and every client (RingClient, AsyncRingClient, the admin calls):

    1. what the caller gives: `tls=TlsFiles(...)` or a directory (`--tls-dir`);
       `tls=None` means in the clear, said, never implied
    2. the directory in the environment variable FLOE_TLS_DIR
    3. the cluster's own `floe-cluster/tls`, beside its cluster file
       (./floe-cluster.json by default), unless that file records an --insecure ring

and nothing else: no certificate is guessed. A handshake the ring refuses, or a peer
speaking TLS to a client in the clear (or the reverse), is told in one line naming
the fix, instead of gRPC's "Socket closed".
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from pathlib import Path

from floering.wire.errors import Unavailable
from floering.wire.tls import TlsFiles

TLS_ENV = "FLOE_TLS_DIR"
CLUSTER_FILE = "floe-cluster.json"


class _Find:
    """The default of every `tls=` argument: find the certificates (see above)."""

    def __repr__(self) -> str:
        return "FIND"


FIND = _Find()

# What a `tls=` argument may be: credentials, their directory, None (in the clear) or
# FIND (the order above).
TlsChoice = TlsFiles | str | Path | _Find | None


class TlsMismatch(Unavailable):
    """The ring and this client disagree about TLS: retrying cannot help."""

    retriable = False


def cluster_tls_dir(cluster_file: str | Path | None = None) -> Path | None:
    """The cluster's own certificate directory, `floe-cluster/tls` beside its cluster
    file, when it exists and the file does not record an --insecure ring."""
    path = Path(cluster_file or CLUSTER_FILE)
    directory = path.resolve().parent / "floe-cluster" / "tls"
    try:
        extra = json.loads(path.read_text()).get("extra_args", [])
        if isinstance(extra, list) and "--insecure" in extra:
            return None
    except (OSError, ValueError, AttributeError):
        pass                                # no (readable) record: the directory decides
    return directory if (directory / "ca.pem").is_file() else None


def find_tls_dir(given: TlsChoice = FIND, *, cluster_file: str | Path | None = None) -> Path | None:
    """The directory holding the certificates, found in the order above (None: in the
    clear). For a caller that hands the directory on, as the Spark driver does to its
    executors."""
    if given is None or given is False:
        return None
    if isinstance(given, TlsFiles):
        return given.ca.parent
    if not isinstance(given, _Find):
        return Path(given)
    if os.environ.get(TLS_ENV):
        return Path(os.environ[TLS_ENV])
    return cluster_tls_dir(cluster_file)


def find_tls(name: str = "client", given: TlsChoice = FIND, *,
             cluster_file: str | Path | None = None) -> TlsFiles | None:
    """`name`'s credentials (`client`, `operator`), found in the order above."""
    if isinstance(given, TlsFiles):
        return given
    directory = find_tls_dir(given, cluster_file=cluster_file)
    return None if directory is None else TlsFiles.in_dir(directory, name)


def _handshake(address: str, tls: TlsFiles | None, timeout: float) -> str:
    """What a TLS handshake with `address` says: 'ok', 'tls' (a TLS peer refused it or
    our trust: `detail`), 'plain' (no TLS there) or 'down'."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    if tls is None:
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_verify_locations(str(tls.ca))
        context.load_cert_chain(str(tls.cert), str(tls.key))
    try:
        raw = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except (OSError, ValueError):
        return "down"
    with raw:
        try:
            with context.wrap_socket(raw) as conn:
                conn.settimeout(timeout)
                try:                       # TLS 1.3: a refused client certificate
                    conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")   # shows on reading
                    conn.recv(1)
                except ssl.SSLError as exc:
                    return "refused: " + (exc.reason or str(exc)).lower().replace("_", " ")
                except OSError:
                    pass
                return "ok"
        except ssl.SSLCertVerificationError as exc:
            return "untrusted: " + (exc.verify_message or str(exc))
        except ssl.SSLError as exc:
            reason = exc.reason or ""
            if reason in ("WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING",
                          "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG") or \
                    isinstance(exc, ssl.SSLEOFError):
                return "plain"
            return "refused: " + (reason or str(exc)).lower().replace("_", " ")
        except (ConnectionError, socket.timeout):
            return "plain"


def explain(address: str, tls: TlsFiles | None, timeout: float = 2.0) -> str | None:
    """One line naming the fix when `address` and a client with `tls` disagree about
    TLS, else None (the node is down, or TLS is not the trouble)."""
    seen = _handshake(address, tls, timeout)
    where = f"the ring at {address}"
    if tls is None:
        if seen.startswith(("ok", "refused", "untrusted")):
            return (f"{where} speaks TLS: pass tls=TlsFiles.in_dir(DIR, 'client') (--tls-dir "
                    f"DIR), set {TLS_ENV}=DIR, or run beside its floe-cluster/tls")
        return None
    source = tls.ca.parent
    if seen == "plain":
        return (f"{where} speaks plain text, not TLS: pass tls=None (--tls-dir is for a TLS "
                f"ring), or unset {TLS_ENV} (the certificates came from {source})")
    if seen.startswith(("refused", "untrusted")):
        return (f"{where} refused the TLS handshake with the certificates in {source} "
                f"({seen}): use the ring's own, --tls-dir DIR or {TLS_ENV}=DIR")
    return None


def mismatch(exc: BaseException, seeds, tls: TlsFiles | None) -> BaseException:
    """`exc` (a first ring fetch that reached no node), or a TlsMismatch when the
    first seed that answers at all disagrees with us about TLS."""
    if not isinstance(exc, Unavailable):
        return exc
    for address in list(seeds)[:3]:
        line = explain(address, tls)
        if line is not None:
            return TlsMismatch(line)
    return exc
