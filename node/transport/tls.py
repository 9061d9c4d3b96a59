"""Who is calling: TLS credentials for a ring and the rule of who may call what.

A ring has its own certificate authority. Every certificate it issues names a role
(the subject's OU: `node`, `client` or `operator`) and a name (the CN: a node's
configured id, e.g. `n0`). Every connection is mutual TLS (gRPC's own credentials):
a node accepts only callers with a certificate of the ring's CA, and the caller's
certificate, never a field of its message, says who is speaking:

- nodes alone exchange ring views, heartbeats, probes, checkpoints and shed requests,
  and every such message with a `sender` field must name the certificate's node:
  exactly its name, or a later member of the same process (`n0#1` for `n0`: the name,
  `#` and a decimal number); an empty `sender` is refused too;
- operators alone move, split and make a node leave;
- clients (mappers, queries) push and query; operators may too, and nodes push (a
  shared key's piece merged back into the key); every role may read the ring and the
  health.

Servers are checked as callers are: a node's certificate also names it as a server
(DNS names `<node>.node.floe-ring` and `node.floe-ring`, `server_name`), and nodes and
clients dial each member under its own name (floering.wire.channels), a seed whose
member they do not know yet under the role's: a client's or operator's certificate
(which carries neither) serves nobody, and a node's serves only as that node.

`generate` writes a throwaway CA and certificates for a local cluster (`floe up`), or
with `keep_ca` issues only what is missing from the CA the directory holds; for
several hosts, see docs/security.md. `reissue` replaces certificates (new keys, same
CA) and `rotate_ca` replaces the CA itself, each followed by a rolling restart. Every
private key is written 0600 from its creation on, in a 0700 directory.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import ipaddress
import os
import re
import socket
import ssl
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from floering.wire.errors import inert
from floering.wire.tls import NODE_ROLE_NAME, ROLES, TlsFiles, server_name
from floering.node.core.membership import sender_matches
from floering.node.transport.intercept import around

VALID_DAYS = 365


# -------------------------------------------------------------- issuing

CA_KEY = "ca.key"              # the key of the CA that issues (never leaves the directory)
NEXT_CA_KEY = "ca-next.key"    # a CA being rotated in: trusted, not issuing yet


def _name(common: str, role: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "floe-ring"),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Replace `path` at once: a node starting meanwhile reads the old file or the new
    one, never half of one. A private file is created 0600 (never readable by others,
    not even before its first byte); a certificate 0644."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()                       # left by a write cut short
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o600 if private else 0o644)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _private_dir(directory: str | Path) -> Path:
    """The certificate directory, created (or kept) 0700."""
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    d.chmod(0o700)
    return d


def _key_bytes(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _certificate(subject, issuer, public_key, signing_key, *, ca: bool, hosts=(),
                 server: str | None = None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               # key identifiers: with two CAs trusted at once (a rotation), each
               # certificate names the key that signed it
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key),
                              critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   signing_key.public_key()), critical=False))
    names: list[x509.GeneralName] = []
    if server is not None:
        names = [x509.DNSName(server_name(server)), x509.DNSName(NODE_ROLE_NAME)]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if host not in (server_name(server) if server else "", NODE_ROLE_NAME):
                names.append(x509.DNSName(host))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _new_ca():
    """A CA certificate and key. Its name carries a random part: two CAs trusted at
    once during a rotation never share a subject."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"floe-ring CA {x509.random_serial_number():x}"[:40], "ca")
    return _certificate(name, name, key.public_key(), key, ca=True), key


def generate(directory: str | Path, nodes, hosts=("127.0.0.1", "localhost"),
             keep_ca: bool = False) -> Path:
    """A fresh CA and certificates for `nodes` (node ids), `client` and `operator`,
    valid for connections to `hosts`. Returns the directory.

    With `keep_ca`, a directory that holds a CA (ca.pem and ca.key) keeps it and every
    certificate still good: only a missing one, one the directory's CAs do not trust
    and a node's that does not carry its server name or `hosts` (from before servers
    were checked) are issued, from that CA. Certificates handed out before stay valid."""
    d = _private_dir(directory)
    wanted = [*((n, "node") for n in nodes), ("client", "client"), ("operator", "operator")]
    if keep_ca and (d / "ca.pem").is_file() and (d / CA_KEY).is_file():
        ca_cert, ca_key = _issuer(d)
        trusted = trusted_cas(d)
        wanted = [(name, role) for name, role in wanted
                  if not _still_good(d, name, role, hosts, trusted)]
    else:
        ca_cert, ca_key = _new_ca()
        _write(d / "ca.pem", _pem(ca_cert))
        _write(d / CA_KEY, _key_bytes(ca_key), private=True)
    for name, role in wanted:
        issue(d, name, role, hosts, ca_cert, ca_key)
    return d


def _still_good(d: Path, name: str, role: str, hosts, trusted) -> bool:
    """Whether `name`'s certificate and key are there, of `role`, signed by a trusted
    CA, valid for a day more, and (a node's) carry its server name and `hosts`."""
    if not (d / f"{name}.pem").is_file() or not (d / f"{name}.key").is_file():
        return False
    try:
        cert = x509.load_pem_x509_certificate((d / f"{name}.pem").read_bytes())
    except ValueError:
        return False
    if _role(cert) != role or not any(_signed_by(cert, ca) for ca in trusted):
        return False
    if cert.not_valid_after_utc < datetime.datetime.now(datetime.timezone.utc) \
            + datetime.timedelta(days=1):
        return False
    return role != "node" or not missing_server_names(cert, name, hosts)


def _role(cert: x509.Certificate) -> str | None:
    ou = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return _text(ou[0].value) if ou else None


def _text(value: str | bytes) -> str:
    """A name attribute's value: text for every attribute these certificates carry."""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def missing_server_names(cert: x509.Certificate, node_id: str, hosts=()) -> list[str]:
    """The names a node's certificate must carry and does not: its server name, the
    role's, and `hosts`."""
    have = set(_hosts(cert))
    return [n for n in (server_name(node_id), NODE_ROLE_NAME, *hosts) if n not in have]


def node_files(directory: str | Path, node_id: str) -> TlsFiles:
    """A node's own TLS files, refused (ValueError, naming the fix) when its certificate
    does not name it as a server: peers and clients would fail every handshake."""
    base = node_id.split("#", 1)[0]
    files = TlsFiles.in_dir(directory, base)
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    missing = missing_server_names(cert, base)
    if _role(cert) != "node" or missing:
        raise ValueError(
            f"{files.cert} is not a server certificate of node {inert(base, 40)} (it lacks "
            f"{', '.join(missing) or 'the node role'}): issued before servers were checked "
            f"or for someone else; re-issue it (`floe up` does for its own cluster; "
            f"tls.reissue(dir, [{base!r}]) otherwise)")
    return files


def issue(directory: Path, name: str, role: str, hosts, ca_cert=None, ca_key=None, *,
          common: str | None = None) -> TlsFiles:
    """One more certificate (a new key, a new serial) from the directory's issuing CA
    (a node added later), or one that replaces `name`'s. Its files are `name`.pem/.key;
    its identity (CN) is `common`, `name` unless given (a client of its own, whose files
    keep the name a client looks for)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    d = _private_dir(directory)
    if ca_cert is None:
        ca_cert, ca_key = _issuer(d)
    key = ec.generate_private_key(ec.SECP256R1())
    # A node's certificate names it as a server (and is valid for `hosts`, for tools
    # that check the address they dial); a client's or operator's serves nobody.
    cert = _certificate(_name(common or name, role), ca_cert.subject, key.public_key(), ca_key,
                        ca=False, hosts=hosts if role == "node" else (),
                        server=name if role == "node" else None)
    _write(d / f"{name}.key", _key_bytes(key), private=True)
    _write(d / f"{name}.pem", _pem(cert))
    return TlsFiles(d / "ca.pem", d / f"{name}.pem", d / f"{name}.key")


# A caller's own identity: what `floe cert` names in a certificate's CN.
IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def issue_identity(ca_dir: str | Path, out: str | Path, name: str, role: str) -> TlsFiles:
    """A client or operator certificate with an identity of its own (`name`), from the
    issuing CA in `ca_dir`, written to a new private directory `out` with the CAs `ca_dir`
    trusts: `out` is then a `--tls-dir` for that caller alone. Nodes count call slots and
    source tables per identity, so callers that should not share them each get one."""
    if role not in ("client", "operator"):
        raise ValueError(f"role must be client or operator, not {role!r}")
    if not isinstance(name, str) or not IDENTITY.fullmatch(name):
        raise ValueError(f"identity {name!r}: 1-64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    if name in ("client", "operator"):
        raise ValueError(f"identity {name!r} is the one `floe up` hands out to every "
                         "caller; choose a name of its own")
    src = Path(ca_dir)
    if not (src / CA_KEY).is_file():
        raise ValueError(f"no issuing CA key ({CA_KEY}) in {src}: certificates are issued "
                         "where the cluster's CA is kept (floe up's floe-cluster/tls)")
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest} exists and is not an empty directory: a caller's "
                         "certificates go to a directory of their own")
    ca_cert, ca_key = _issuer(src)
    d = _private_dir(dest)
    _write(d / "ca.pem", (src / "ca.pem").read_bytes())
    return issue(d, role, role, (), ca_cert, ca_key, common=name)


def trusted_cas(directory: str | Path) -> list[x509.Certificate]:
    """Every CA in the directory's ca.pem (a bundle: more than one during a rotation)."""
    return x509.load_pem_x509_certificates((Path(directory) / "ca.pem").read_bytes())


def _load_key(path: Path):
    return serialization.load_pem_private_key(path.read_bytes(), None)


def _spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def _ca_of(directory: Path, key) -> x509.Certificate:
    """The trusted CA certificate of the private `key`."""
    for cert in trusted_cas(directory):
        if _spki(cert.public_key()) == _spki(key.public_key()):
            return cert
    raise ValueError(f"no CA in {directory / 'ca.pem'} has the key of this directory's CA")


def _issuer(directory: Path):
    key = _load_key(directory / CA_KEY)
    return _ca_of(directory, key), key


def holders(directory: str | Path) -> list[str]:
    """The names of every certificate with its key in the directory (nodes, client,
    operator), the CAs' own files aside."""
    d = Path(directory)
    return sorted(p.stem for p in d.glob("*.pem")
                  if p.name != "ca.pem" and (d / f"{p.stem}.key").is_file())


def reissue(directory: str | Path, names=None) -> list[str]:
    """Replace the certificates of `names` (default: every holder) with new ones from
    the issuing CA: a new key and serial, the same role, name and hosts. Running nodes
    keep what they loaded; each presents its new certificate once restarted."""
    d = Path(directory)
    names = holders(d) if names is None else list(names)
    ca = _issuer(d)
    for name in names:
        old = x509.load_pem_x509_certificate((d / f"{name}.pem").read_bytes())
        role = _role(old)
        if role is None:
            raise ValueError(f"{d / name}.pem names no role (organizational unit)")
        issue(d, name, role, _hosts(old), *ca)
    return names


def _hosts(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return ([str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
            + san.get_values_for_type(x509.DNSName))


# A CA is rotated in three steps, every node restarted after each (a rolling restart,
# so the ring never stops): at every moment, each pair of processes trusts the CA
# of the other's certificate.

def trust_next_ca(directory: str | Path) -> x509.Certificate:
    """Step 1: a new CA, appended to ca.pem (trusted next to the old one). The old CA
    still issues."""
    d = Path(directory)
    if (d / NEXT_CA_KEY).exists():
        raise ValueError(f"a CA rotation is already under way in {d} ({NEXT_CA_KEY})")
    cert, key = _new_ca()
    _write(d / NEXT_CA_KEY, _key_bytes(key), private=True)
    _write(d / "ca.pem", (d / "ca.pem").read_bytes() + _pem(cert))
    return cert


def issue_from_next_ca(directory: str | Path) -> list[str]:
    """Step 2, once every node trusts the new CA: it becomes the issuing CA (the old
    one's key is deleted) and every certificate is re-issued from it."""
    d = Path(directory)
    if not (d / NEXT_CA_KEY).exists():
        raise ValueError(f"no CA rotation under way in {d}: trust_next_ca first")
    _ca_of(d, _load_key(d / NEXT_CA_KEY))                # it is trusted already
    (d / NEXT_CA_KEY).replace(d / CA_KEY)
    return reissue(d)


def drop_old_cas(directory: str | Path) -> list[x509.Certificate]:
    """Step 3, once every node presents a certificate of the new CA: ca.pem keeps the
    issuing CA only. Returns the CAs no longer trusted."""
    d = Path(directory)
    if (d / NEXT_CA_KEY).exists():
        raise ValueError(f"the new CA does not issue yet in {d}: issue_from_next_ca first")
    issuing, _ = _issuer(d)
    dropped = [c for c in trusted_cas(d) if c != issuing]
    _write(d / "ca.pem", _pem(issuing))
    return dropped


CA_ROTATION = (trust_next_ca, issue_from_next_ca, drop_old_cas)


def rotate_ca(directory: str | Path, restart) -> None:
    """Every step of a CA rotation, calling `restart(step)` (restart every node, one
    at a time, and move every client to the files now in the directory) after each."""
    for step in CA_ROTATION:
        step(directory)
        restart(step.__name__)


def served_certificate(address: str, tls: TlsFiles) -> x509.Certificate:
    """The certificate the node at `address` presents, verified against `tls.ca`
    (a TLS handshake with `tls`'s own certificate; nothing is called)."""
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(tls.ca))
    context.load_cert_chain(str(tls.cert), str(tls.key))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as conn:
            der = conn.getpeercert(binary_form=True)
            if der is None:
                raise ssl.SSLError(f"{host}:{port} presented no certificate")
            return x509.load_der_x509_certificate(der)


# ------------------------------------------------------------- checking

def peer_identity(context) -> tuple[str, str] | None:
    """(role, name) from the caller's certificate, or None without one."""
    pem = context.auth_context().get("x509_pem_cert")
    if not pem:
        return None
    return _identity_of(pem[0])


@functools.lru_cache(maxsize=256)
def _identity_of(pem: bytes) -> tuple[str, str] | None:
    # Parsing a certificate costs more than a small call itself; a node sees the same
    # few certificates on every call (TLS has verified them), so each is parsed once.
    cert = x509.load_pem_x509_certificate(pem)
    role = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    name = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not role or not name:
        return None
    return _text(role[0].value), _text(name[0].value)


# Who may call each method (by its last path element); anything not listed: nobody.
NODE_ONLY = frozenset({"ExchangeRing", "Heartbeat", "Probe", "ShipCheckpoint", "RequestShed",
                       "RangeHeld", "RestoreRange"})
OPERATOR_ONLY = frozenset({"Move", "Split", "Leave", "ExportRange", "ImportRange"})
CLIENTS = frozenset({"Push"})
EVERYONE = frozenset({"GetRing", "Get", "Top", "Scan", "Stats", "InspectRange", "Check",
                      "Watch", "ServerReflectionInfo"})


def may_call(role: str, method: str) -> bool:
    if method in EVERYONE:
        return True
    if method in NODE_ONLY:
        return role == "node"
    if method in OPERATOR_ONLY:
        return role == "operator"
    if method in CLIENTS:
        return role in ("client", "operator", "node")
    return False


def has_sender(request) -> bool:
    """Whether the request's message type has a `sender` field (set or not)."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    return descriptor is not None and "sender" in descriptor.fields_by_name


class Authorizer(grpc.aio.ServerInterceptor):
    """Refuses, PERMISSION_DENIED, a call its caller's role may not make, and a node's
    message with a `sender` field that does not name the node its certificate names
    (an empty one included)."""

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
            return                            # (abort raises)
        role, name = who
        if not may_call(role, method):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"a {role} certificate may not call {method}")
        if role == "node" and request is not None and has_sender(request) \
                and not sender_matches(name, request.sender):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"the certificate names node {inert(name, 40)}, the "
                                f"message claims sender {inert(request.sender, 40)}")

    @contextlib.asynccontextmanager
    async def checked(request, context):
        await check(request, context)
        yield

    return around(handler, checked)
