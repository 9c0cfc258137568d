"""`pinmq certs`: the development CA and the node and client certificates it signs, judged by
real TLS handshakes on loopback (a server thread, a client, both verifying), by the files'
modes, and by what a second run may and may not overwrite.

The contexts verify with VERIFY_X509_STRICT, Python 3.13's default: the certificates must
pass the verifiers nodes will meet, not only a lenient one.
"""

from __future__ import annotations

import ast
import datetime
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pinmq.certs import CertsError, write_certs

NODES = ("node1", "node1-backup", "node2", "node3")
HOST, HOST_IP = "broker.example.test", "10.11.12.13"  # the --hosts of these tests
TIMEOUT_S = 10.0
# OpenSSL's X509_V_ERR_* codes. A server sends the CA it trusts with its own certificate, so
# a client trusting another CA may see an untrusted self-signed CA rather than no issuer.
HOSTNAME_MISMATCH, IP_MISMATCH, WRONG_PURPOSE, NOT_A_CA = 62, 64, 26, 79
UNTRUSTED = {19, 20}  # SELF_SIGNED_CERT_IN_CHAIN, UNABLE_TO_GET_ISSUER_CERT_LOCALLY


@dataclass
class Outcome:
    """One connection: whom each side saw, or why each side failed."""

    server_saw: str | None = None  # the CN of the client's certificate
    client_saw: str | None = None  # the CN of the server's certificate
    server_error: BaseException | None = None
    client_error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.server_error is None and self.client_error is None


def issue(directory: Path, **options: object) -> list[Path]:
    return write_certs(directory, NODES, hosts=[HOST, HOST_IP], clients=["alice"], **options)


def server_context(certs: Path, name: str, trust: Path | None = None) -> ssl.SSLContext:
    """A server presenting NAME's certificate and requiring a client certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs / f"{name}.crt", certs / f"{name}.key")
    context.load_verify_locations(trust or certs / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def client_context(trust: Path, certs: Path | None = None, name: str = "") -> ssl.SSLContext:
    """A client trusting only `trust`, presenting NAME's certificate if given one."""
    context = ssl.create_default_context(cafile=trust)
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    if certs is not None:
        context.load_cert_chain(certs / f"{name}.crt", certs / f"{name}.key")
    return context


def common_name(peer: dict | None) -> str | None:
    if not peer:
        return None
    return dict(pair for rdn in peer["subject"] for pair in rdn)["commonName"]


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> Outcome:
    """Connect `client` to a `server` on an ephemeral loopback port, as `server_hostname`.

    The server answers b"ok" after its handshake and the client reads it: under TLS 1.3 a
    server rejects a client certificate only after the client's handshake has returned.
    """
    outcome = Outcome()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT_S)
        thread = threading.Thread(target=_serve, args=(listener, server, outcome), daemon=True)
        thread.start()
        try:
            address = listener.getsockname()
            with (
                socket.create_connection(address, timeout=TIMEOUT_S) as raw,
                client.wrap_socket(raw, server_hostname=server_hostname) as tls,
            ):
                outcome.client_saw = common_name(tls.getpeercert())
                if tls.recv(2) != b"ok":
                    raise ConnectionError("the server closed the connection")
        except (ssl.SSLError, OSError) as err:
            outcome.client_error = err
        finally:
            thread.join(TIMEOUT_S)
    assert not thread.is_alive(), "the server never finished its handshake"
    return outcome


def _serve(listener: socket.socket, context: ssl.SSLContext, outcome: Outcome) -> None:
    try:
        connection, _ = listener.accept()
        connection.settimeout(TIMEOUT_S)
        with connection, context.wrap_socket(connection, server_side=True) as tls:
            outcome.server_saw = common_name(tls.getpeercert())
            tls.sendall(b"ok")
    except (ssl.SSLError, OSError) as err:
        outcome.server_error = err


def verify_code(error: BaseException | None) -> int | None:
    assert isinstance(error, ssl.SSLCertVerificationError), repr(error)
    return error.verify_code


def snapshot(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    directory = tmp_path / "certs"
    issue(directory)
    return directory


def test_nodes_verify_each_other_by_every_name_their_certificates_carry(certs: Path) -> None:
    server = server_context(certs, "node1")
    client = client_context(certs / "ca.crt", certs, "node2")
    for name in ("localhost", "127.0.0.1", "::1", "node1", HOST, HOST_IP):
        outcome = handshake(server, client, name)
        assert outcome.ok, (name, outcome)
        assert (outcome.server_saw, outcome.client_saw) == ("node2", "node1"), name
    # The other way round: every node certificate serves and connects (mutual TLS).
    outcome = handshake(
        server_context(certs, "node2"), client_context(certs / "ca.crt", certs, "node1"), "node2"
    )
    assert (outcome.ok, outcome.server_saw, outcome.client_saw) == (True, "node1", "node2")


def test_a_name_the_certificate_does_not_carry_fails_the_hostname_check(certs: Path) -> None:
    server = server_context(certs, "node1")
    client = client_context(certs / "ca.crt", certs, "node2")
    for name, code in (
        ("node2", HOSTNAME_MISMATCH),  # another node's name
        ("elsewhere.example.test", HOSTNAME_MISMATCH),
        ("127.0.0.2", IP_MISMATCH),
    ):
        outcome = handshake(server, client, name)
        assert verify_code(outcome.client_error) == code, name
        assert outcome.server_saw is None


def test_certificates_of_another_ca_are_refused_both_ways(certs: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_certs(other, NODES)
    assert (other / "ca.crt").read_bytes() != (certs / "ca.crt").read_bytes()
    # A client trusting the other CA does not trust node1.
    outcome = handshake(
        server_context(certs, "node1"), client_context(other / "ca.crt", other, "node2"), "node1"
    )
    assert verify_code(outcome.client_error) in UNTRUSTED
    # A server refuses a client certificate of the other CA.
    outcome = handshake(
        server_context(certs, "node1"), client_context(certs / "ca.crt", other, "node2"), "node1"
    )
    assert outcome.server_error is not None and outcome.client_error is not None
    assert outcome.server_saw is None


@pytest.mark.parametrize("signer", ["ca", "node2"])
def test_a_node_certificate_cannot_sign_certificates(
    certs: Path, tmp_path: Path, signer: str
) -> None:
    """node2's key signs a certificate for node1: the chain fails, since node2 is no CA. The
    same certificate signed by the CA's key passes, so the forgery is all that fails."""
    issuer = x509.load_pem_x509_certificate((certs / f"{signer}.crt").read_bytes())
    issuer_key = serialization.load_pem_private_key(
        (certs / f"{signer}.key").read_bytes(), password=None
    )
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    forged = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node1")]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("node1")]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(issuer_ski),
            critical=False,
        )
        .sign(issuer_key, hashes.SHA256())
    )
    forger = tmp_path / "forger"
    forger.mkdir()
    chain = forged.public_bytes(serialization.Encoding.PEM)
    if signer != "ca":
        chain += (certs / f"{signer}.crt").read_bytes()
    (forger / "node1.crt").write_bytes(chain)
    (forger / "node1.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = server_context(forger, "node1", trust=certs / "ca.crt")
    outcome = handshake(server, client_context(certs / "ca.crt", certs, "node2"), "node1")
    if signer == "ca":
        assert outcome.ok, outcome
    else:
        assert verify_code(outcome.client_error) == NOT_A_CA
        # Not only the CA's path length and node2's key usage forbid it: node2 is no CA.
        constraints = issuer.extensions.get_extension_for_class(x509.BasicConstraints)
        assert (constraints.critical, constraints.value.ca) == (True, False)


def test_a_client_certificate_names_its_user_and_cannot_serve(certs: Path) -> None:
    outcome = handshake(
        server_context(certs, "node1"), client_context(certs / "ca.crt", certs, "alice"), "node1"
    )
    assert (outcome.ok, outcome.server_saw) == (True, "alice")
    # No serverAuth: a client refuses a server that presents alice's certificate.
    outcome = handshake(
        server_context(certs, "alice"), client_context(certs / "ca.crt", certs, "node2"), "alice"
    )
    assert verify_code(outcome.client_error) == WRONG_PURPOSE


def test_clients_alone_need_no_nodes(tmp_path: Path) -> None:
    written = write_certs(tmp_path / "c", [], clients=["bob"])
    assert [p.name for p in written] == ["ca.key", "ca.crt", "bob.key", "bob.crt"]


@pytest.fixture
def umask_027() -> Iterator[None]:
    """A umask that would make certificates 0640 and the directory 0750 if obeyed blindly."""
    previous = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("umask_027")
def test_keys_are_0600_certificates_0644_and_the_directory_0700(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "certs"
    written = issue(directory)
    names = {f"{name}.{ext}" for name in ("ca", *NODES, "alice") for ext in ("crt", "key")}
    assert {path.name for path in written} == names
    assert {path.name for path in directory.iterdir()} == names  # no temporary file left
    assert directory.stat().st_mode & 0o777 == 0o700
    for path in written:
        mode = path.stat().st_mode & 0o777
        if path.suffix == ".key":
            assert mode == 0o600, path
            # Unencrypted PKCS8: a node reads it at start without a passphrase.
            assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
            serialization.load_pem_private_key(path.read_bytes(), password=None)
        else:
            assert mode == 0o644, path


def test_validity_is_days_for_certificates_and_years_for_the_ca(tmp_path: Path) -> None:
    write_certs(tmp_path, ["node1"], days=30)
    now = datetime.datetime.now(datetime.UTC)
    node = x509.load_pem_x509_certificate((tmp_path / "node1.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    left = node.not_valid_after_utc - now
    assert datetime.timedelta(days=29) < left <= datetime.timedelta(days=30)
    assert ca.not_valid_after_utc - now > datetime.timedelta(days=3640)
    assert ca.subject.rfc4514_string() == "CN=pinmq development CA"


def test_an_existing_ca_is_never_overwritten(certs: Path) -> None:
    before = snapshot(certs)
    with pytest.raises(CertsError, match="--reuse-ca") as refused:
        issue(certs)
    assert "exists" in str(refused.value)
    assert snapshot(certs) == before  # nothing was written, not even a node certificate
    (certs / "ca.crt").unlink()  # the key alone is a CA too
    with pytest.raises(CertsError, match=r"ca\.key"):
        write_certs(certs, ["node2"])
    assert (certs / "ca.key").read_bytes() == before["ca.key"]


def test_reuse_ca_rotates_a_node_certificate_under_the_same_ca(certs: Path, tmp_path: Path) -> None:
    before = snapshot(certs)
    old_ca = tmp_path / "old-ca.crt"
    old_ca.write_bytes(before["ca.crt"])
    written = write_certs(certs, ["node2"], reuse_ca=True)
    assert written == [certs / "node2.key", certs / "node2.crt"]
    after = snapshot(certs)
    changed = {name for name in before if after[name] != before[name]}
    assert changed == {"node2.key", "node2.crt"}
    # The new node2 is trusted by whoever trusted the CA before the rotation, both ways.
    outcome = handshake(
        server_context(certs, "node2"), client_context(old_ca, certs, "node1"), "node2"
    )
    assert (outcome.ok, outcome.server_saw, outcome.client_saw) == (True, "node1", "node2")
    outcome = handshake(
        server_context(certs, "node1", trust=old_ca), client_context(old_ca, certs, "node2"), HOST
    )
    assert (outcome.ok, outcome.server_saw) == (True, "node2")
    # A rotation takes its --hosts anew: none were given this time.
    outcome = handshake(
        server_context(certs, "node2"), client_context(old_ca, certs, "node1"), HOST
    )
    assert verify_code(outcome.client_error) == HOSTNAME_MISMATCH


def test_reuse_ca_without_a_ca_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CertsError, match="no CA"):
        write_certs(tmp_path / "none", ["node1"], reuse_ca=True)
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(
    "name", ["../evil", "a/b", "", "node 1", "-rf", ".hidden", "ca", "CA", "é", "x" * 65]
)
def test_a_bad_name_is_refused_by_name_before_anything_is_written(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(CertsError) as refused:
        write_certs(tmp_path / "certs", ["node1", name])
    assert repr(name) in str(refused.value)
    assert not (tmp_path / "certs").exists()


@pytest.mark.parametrize("names", [["node1", "node1"], ["node1", "NODE1"]])
def test_a_name_given_twice_is_refused(tmp_path: Path, names: Sequence[str]) -> None:
    with pytest.raises(CertsError, match="twice"):
        write_certs(tmp_path, names[:1], clients=names[1:])


@pytest.mark.parametrize("host", ["not a host", "-x.example", "a..b", "x/y"])
def test_a_bad_host_is_refused_by_name(tmp_path: Path, host: str) -> None:
    with pytest.raises(CertsError) as refused:
        write_certs(tmp_path / "certs", ["node1"], hosts=[host])
    assert repr(host) in str(refused.value)


def pinmq_certs(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pinmq.cli", "certs", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_the_cli_prints_the_files_written_and_exits_by_outcome(tmp_path: Path) -> None:
    directory = tmp_path / "certs"
    done = pinmq_certs(directory, "--nodes", "node1,node2", "--hosts", HOST, "--clients", "alice")
    assert (done.returncode, done.stderr) == (0, "")
    expected = [f"{n}.{e}" for n in ("ca", "node1", "node2", "alice") for e in ("key", "crt")]
    assert done.stdout.splitlines() == [str(directory / name) for name in expected]
    ca = (directory / "ca.crt").read_bytes()

    again = pinmq_certs(directory, "--nodes", "node1")
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr.startswith("pinmq: error: ") and "--reuse-ca" in again.stderr

    rotated = pinmq_certs(directory, "--nodes", "node2", "--reuse-ca", "--days", "30")
    assert rotated.returncode == 0, rotated.stderr
    assert rotated.stdout.splitlines() == [str(directory / n) for n in ("node2.key", "node2.crt")]
    assert (directory / "ca.crt").read_bytes() == ca
    for run in (done, again, rotated):
        assert "PRIVATE KEY" not in run.stdout + run.stderr


def test_the_cli_refuses_bad_input(tmp_path: Path) -> None:
    bad = pinmq_certs(tmp_path / "a", "--nodes", "node1,../evil")
    assert bad.returncode == 1 and "'../evil'" in bad.stderr
    assert not (tmp_path / "a").exists()
    nothing = pinmq_certs(tmp_path / "b")
    assert nothing.returncode == 2 and "--nodes" in nothing.stderr
    zero = pinmq_certs(tmp_path / "c", "--nodes", "node1", "--days", "0")
    assert zero.returncode == 2


def test_only_the_certs_verb_loads_cryptography() -> None:
    code = "import sys, pinmq.cli; print('cryptography' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


def test_pinmq_certs_imports_the_standard_library_cryptography_and_one_file_writer() -> None:
    tree = ast.parse((REPO / "pinmq" / "certs.py").read_text())
    imported = {
        name
        for node in ast.walk(tree)
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
    }
    outside = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
    assert {name.split(".")[0] for name in outside} == {"cryptography", "broker"}
    assert {name for name in outside if name.startswith("broker")} == {"broker.atomic_file"}
