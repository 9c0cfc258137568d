"""`pinmq certs`: a development CA, and a key and certificate per node, for mutual TLS.

Nodes present their certificates to each other, as servers and as clients, so a node
certificate carries serverAuth and clientAuth; a client certificate (for `client-auth:
required`) names its user in its subject CN and carries clientAuth only. This is for
development and tests: the CA key lies unencrypted next to the certificates it signs.

An entry point: it imports the standard library and `cryptography`, nothing of pinmq, and the
`pinmq certs` verb imports it lazily so that the other verbs do not load `cryptography`.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PublicKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.atomic_file import write_atomically

CA_NAME = "pinmq development CA"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
DEFAULT_DAYS = 825
CA_MIN_DAYS = 3650  # the CA outlives the certificates it signs: rotating one reuses the CA
LOOPBACK = ("localhost", "127.0.0.1", "::1")  # in every node certificate: local clusters
CLOCK_SKEW = datetime.timedelta(minutes=5)  # valid from a little earlier: peers' clocks differ
KEY_MODE = 0o600
CERT_MODE = 0o644
DIR_MODE = 0o700
# A name becomes a file name and a CN (at most 64 characters, RFC 5280): no path separators,
# no hidden files, no option-like leading '-'.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DNS_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_ISSUER_KEYS = (
    ec.EllipticCurvePrivateKey,
    rsa.RSAPrivateKey,
    dsa.DSAPrivateKey,
    ed25519.Ed25519PrivateKey,
    ed448.Ed448PrivateKey,
)


class CertsError(Exception):
    """What `pinmq certs` refuses to do, worded for a person: the CLI prints it and exits 1."""


@dataclass(frozen=True)
class _Ca:
    key: CertificateIssuerPrivateKeyTypes
    cert: x509.Certificate


def write_certs(
    directory: Path,
    nodes: Sequence[str],
    hosts: Sequence[str] = (),
    clients: Sequence[str] = (),
    reuse_ca: bool = False,
    days: int = DEFAULT_DAYS,
) -> list[Path]:
    """Write a CA (or, with `reuse_ca`, sign with the one in `directory`) and the certificates
    of `nodes` and `clients`; return the files written.

    Everything is checked before the first file is written, so a refusal leaves the directory
    as it was. An existing CA is never overwritten: replacing it would strand every certificate
    it signed, so rotating a node's certificate is `reuse_ca`.
    """
    if days <= 0:
        raise CertsError(f"days must be > 0, got {days}")
    _check_names([*nodes, *clients])
    extra = [_general_name(host, "--hosts") for host in hosts]
    node_sans = {node: _sans([_general_name(node, "node"), *_loopback(), *extra]) for node in nodes}
    if directory.exists() and not directory.is_dir():
        raise CertsError(f"{directory} exists and is not a directory")
    written: list[Path] = []
    if reuse_ca:
        ca = _load_ca(directory)
    else:
        present = [name for name in (CA_CERT, CA_KEY) if (directory / name).exists()]
        if present:
            raise CertsError(
                f"a CA already exists in {directory} ({', '.join(present)}): refusing to "
                "overwrite it; --reuse-ca issues new node certificates signed by it (that is "
                "how a node certificate is rotated)"
            )
        _make_directory(directory)
        ca = _new_ca(days)
        written += _write_pair(directory, "ca", ca.key, ca.cert)
    client_usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    node_usage = [ExtendedKeyUsageOID.SERVER_AUTH, *client_usage]
    for node, sans in node_sans.items():
        key, cert = _issue(ca, node, sans, node_usage, days)
        written += _write_pair(directory, node, key, cert)
    for client in clients:
        key, cert = _issue(ca, client, [], client_usage, days)
        written += _write_pair(directory, client, key, cert)
    return written


def _check_names(names: Sequence[str]) -> None:
    """Refuse a name that is not a plain file name, or that would overwrite another's files."""
    if not names:
        raise CertsError("nothing to issue: name some nodes (--nodes) or clients (--clients)")
    seen: set[str] = set()
    for name in names:
        if not _NAME.fullmatch(name):
            raise CertsError(
                f"invalid name {name!r}: use 1 to 64 letters, digits, '_', '.' and '-', "
                "starting with a letter or digit"
            )
        folded = name.lower()  # node1 and NODE1 are one file on a case-insensitive disk
        if folded == "ca":
            raise CertsError(f"invalid name {name!r}: ca.crt and ca.key are the CA's files")
        if folded in seen:
            raise CertsError(f"name {name!r} given twice: its files would overwrite each other")
        seen.add(folded)


def _general_name(host: str, what: str) -> x509.GeneralName:
    """A SAN entry: an IP address, else a DNS name (a bad one would fail every handshake)."""
    with contextlib.suppress(ValueError):
        return x509.IPAddress(ipaddress.ip_address(host))
    labels = host.split(".")
    if len(host) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise CertsError(f"{what} {host!r} is neither a DNS name nor an IP address")
    return x509.DNSName(host.lower())


def _loopback() -> list[x509.GeneralName]:
    return [_general_name(host, "loopback") for host in LOOPBACK]


def _sans(names: Sequence[x509.GeneralName]) -> list[x509.GeneralName]:
    unique: list[x509.GeneralName] = []
    for name in names:
        if name not in unique:
            unique.append(name)
    return unique


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _cn(name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])


def _key_usage(*, sign: bool, certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=certs,
        crl_sign=certs,
        encipher_only=False,
        decipher_only=False,
    )


def _hash_for(key: CertificateIssuerPrivateKeyTypes) -> hashes.HashAlgorithm | None:
    """SHA-256, but EdDSA keys hash internally and refuse an algorithm."""
    if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return None
    return hashes.SHA256()


def _new_ca(days: int) -> _Ca:
    """A self-signed CA that may sign end-entity certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())  # P-256: generated in a millisecond
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_cn(CA_NAME))
        .issuer_name(_cn(CA_NAME))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=max(days, CA_MIN_DAYS)))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign=False, certs=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Ca(key, cert)


def _load_ca(directory: Path) -> _Ca:
    """The CA already in `directory`, checked: a CA certificate and its own key."""
    paths = [directory / CA_CERT, directory / CA_KEY]
    missing = [path.name for path in paths if not path.exists()]
    if len(missing) == len(paths):
        raise CertsError(
            f"--reuse-ca: there is no CA in {directory} to reuse (no {CA_CERT}, no {CA_KEY}); "
            "run without --reuse-ca to create one"
        )
    if missing:
        raise CertsError(f"the CA in {directory} is incomplete: {missing[0]} is missing")
    try:
        cert = x509.load_pem_x509_certificate(paths[0].read_bytes())
        key = serialization.load_pem_private_key(paths[1].read_bytes(), password=None)
    except (ValueError, TypeError) as err:  # TypeError: an encrypted key
        raise CertsError(f"cannot read the CA in {directory}: {err}") from err
    if not isinstance(key, _ISSUER_KEYS):
        raise CertsError(f"{paths[1]} is a {type(key).__name__}, which cannot sign certificates")
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise CertsError(f"{paths[1]} is not the key of {paths[0]}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CertsError(f"{paths[0]} is not a CA certificate (basicConstraints CA:true)")
    if cert.not_valid_after_utc <= _now():
        raise CertsError(
            f"the CA in {directory} expired on {cert.not_valid_after_utc:%Y-%m-%d}: move "
            f"{CA_CERT} and {CA_KEY} away to create a new one"
        )
    return _Ca(key, cert)


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _issue(
    ca: _Ca,
    name: str,
    sans: Sequence[x509.GeneralName],
    usages: Sequence[x509.ObjectIdentifier],
    days: int,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new key and an end-entity certificate for it, CN `name`, signed by `ca`.

    It expires with the CA at the latest: a certificate that outlives its issuer is invalid
    from then on anyway. The key identifiers let strict verifiers (Python 3.13's default
    contexts) build the chain.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    try:
        ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_cn(name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + datetime.timedelta(days=days), ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign=True, certs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(aki, critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return key, builder.sign(ca.key, _hash_for(ca.key))


def _write_pair(
    directory: Path, name: str, key: CertificateIssuerPrivateKeyTypes, cert: x509.Certificate
) -> list[Path]:
    """Write NAME.key (0600, unencrypted PKCS8: a node reads it at start with no passphrase),
    then NAME.crt (0644)."""
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.crt"
    write_atomically(key_path, key_pem, KEY_MODE)
    write_atomically(cert_path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    return [key_path, cert_path]


def _make_directory(directory: Path) -> None:
    """Create `directory` 0700 if missing (whatever the umask); an existing one is left as is."""
    try:
        directory.mkdir(mode=DIR_MODE, parents=True)
    except FileExistsError:
        return
    os.chmod(directory, DIR_MODE)
