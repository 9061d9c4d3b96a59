"""Who is calling: TLS credentials for a ring and the rule of who may call what.

A ring has its own certificate authority. Every certificate it issues names a role
(the subject's OU: `node`, `client` or `operator`) and a name (the CN: a node's
configured id, e.g. `n0`). Every connection is mutual TLS (gRPC's own credentials):
a node accepts only callers with a certificate of the ring's CA, and the caller's
certificate, never a field of its message, says who is speaking:

- nodes alone exchange ring views, heartbeats, probes, checkpoints and shed requests,
  and the `sender` they claim must be their certificate's name (or a later member of
  the same process: `n0#1` for `n0`);
- operators alone move, split and make a node leave;
- clients (mappers, queries) push and query; operators may too; every role may read
  the ring and the health.

`generate` writes a throwaway CA and certificates for a local cluster (`floe up`);
for several hosts, see docs/security.md.
"""

from __future__ import annotations

import datetime
import inspect
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ROLES = ("node", "client", "operator")
VALID_DAYS = 365


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


# -------------------------------------------------------------- issuing

def _name(common: str, role: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "floe-ring"),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _certificate(subject, issuer, public_key, signing_key, *, ca: bool, hosts=()):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if hosts:
        names = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def generate(directory: str | Path, nodes, hosts=("127.0.0.1", "localhost")) -> Path:
    """A fresh CA and certificates for `nodes` (node ids), `client` and `operator`,
    valid for connections to `hosts`. Returns the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("floe-ring CA", "ca")
    ca_cert = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    (d / "ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(d / "ca.key", ca_key)
    for name, role in [*((n, "node") for n in nodes), ("client", "client"),
                       ("operator", "operator")]:
        issue(d, name, role, hosts, ca_cert, ca_key)
    return d


def issue(directory: Path, name: str, role: str, hosts, ca_cert=None, ca_key=None) -> TlsFiles:
    """One more certificate from the directory's CA (a node added later)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    d = Path(directory)
    if ca_cert is None:
        ca_cert = x509.load_pem_x509_certificate((d / "ca.pem").read_bytes())
        ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(_name(name, role), ca_cert.subject, key.public_key(), ca_key,
                        ca=False, hosts=hosts)
    (d / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(d / f"{name}.key", key)
    return TlsFiles(d / "ca.pem", d / f"{name}.pem", d / f"{name}.key")


# ------------------------------------------------------------- checking

def peer_identity(context) -> tuple[str, str] | None:
    """(role, name) from the caller's certificate, or None without one."""
    pem = context.auth_context().get("x509_pem_cert")
    if not pem:
        return None
    cert = x509.load_pem_x509_certificate(pem[0])
    role = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    name = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not role or not name:
        return None
    return role[0].value, name[0].value


# Who may call each method (by its last path element); anything not listed: nobody.
NODE_ONLY = frozenset({"ExchangeRing", "Heartbeat", "Probe", "ShipCheckpoint", "RequestShed"})
OPERATOR_ONLY = frozenset({"Move", "Split", "Leave"})
CLIENTS = frozenset({"Push"})
EVERYONE = frozenset({"GetRing", "Get", "Top", "Scan", "Stats", "InspectRange", "Check",
                      "Watch"})


def may_call(role: str, method: str) -> bool:
    if method in EVERYONE:
        return True
    if method in NODE_ONLY:
        return role == "node"
    if method in OPERATOR_ONLY:
        return role == "operator"
    if method in CLIENTS:
        return role in ("client", "operator")
    return False


def sender_matches(name: str, sender: str) -> bool:
    """A node's claimed `sender` is its certificate's name, or a later member the same
    process became (`n0#1`, `n0#2` for `n0`)."""
    return sender == name or sender.startswith(name + "#")


class Authorizer(grpc.aio.ServerInterceptor):
    """Refuses, PERMISSION_DENIED, a call its caller's role may not make, and a node's
    message whose `sender` is not the node its certificate names."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        return _guarded(handler, method)


def _guarded(handler, method: str):
    async def check(request, context) -> None:
        who = peer_identity(context)
        if who is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
        role, name = who
        if not may_call(role, method):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"a {role} certificate may not call {method}")
        sender = getattr(request, "sender", "") if request is not None else ""
        if role == "node" and sender and not sender_matches(name, sender):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"the certificate names {name!r:.40}, the message "
                                f"claims {sender!r:.40}")

    if handler.unary_unary:
        async def unary_unary(request, context):
            await check(request, context)
            return await handler.unary_unary(request, context)
        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream:
        async def unary_stream(request, context):
            await check(request, context)
            replies = handler.unary_stream(request, context)
            if inspect.isasyncgen(replies):
                async for reply in replies:
                    yield reply
            else:                      # a handler that writes with context.write
                await replies
        return grpc.unary_stream_rpc_method_handler(
            unary_stream, handler.request_deserializer, handler.response_serializer)
    if handler.stream_stream:
        async def stream_stream(requests, context):
            await check(None, context)
            async for reply in handler.stream_stream(requests, context):
                yield reply
        return grpc.stream_stream_rpc_method_handler(
            stream_stream, handler.request_deserializer, handler.response_serializer)
    async def stream_unary(requests, context):
        await check(None, context)
        return await handler.stream_unary(requests, context)
    return grpc.stream_unary_rpc_method_handler(
        stream_unary, handler.request_deserializer, handler.response_serializer)
