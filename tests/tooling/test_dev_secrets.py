"""`make secrets` (deploy/dev_secrets.py): the shipped cluster's development secrets, made once
with pinmq's own commands and reused, private, and never printed off a terminal.

Run in a directory of the test's own (the repository's secrets/ is left alone). No assertion
shows the password: its files are compared by digest.
"""

from __future__ import annotations

import hashlib
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from broker.users import Users

NODES = ("node1", "node1-backup", "node2", "node2-backup", "node3", "node3-backup")
SCRIPT = REPO / "deploy" / "dev_secrets.py"


def make_secrets(directory: Path) -> str:
    """Run the script as `make secrets` does (stdout not a terminal); what it printed."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def contents(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("make-secrets") / "secrets"
    return directory, make_secrets(directory)


def test_the_first_run_makes_a_ca_node_certificates_a_user_and_the_client_settings(
    secrets: tuple[Path, str],
) -> None:
    directory, printed = secrets
    names = {"ca.crt", "ca.key", "users.yaml", "admin.password", "client.env"}
    names |= {f"{node}.{kind}" for node in NODES for kind in ("crt", "key")}
    assert {p.name for p in directory.iterdir()} == names
    password = (directory / "admin.password").read_text().removesuffix("\n")
    assert len(password) >= 24 and "\n" not in password
    assert password not in printed  # not a terminal: the output names the file instead
    assert f"{directory}/admin.password" in printed
    assert f"source {directory}/client.env" in printed
    principal = Users(directory / "users.yaml").authenticate("admin", password)
    assert principal is not None and principal.roles == frozenset({"admin"})


def test_every_secret_is_private(secrets: tuple[Path, str]) -> None:
    directory, _ = secrets
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    private = ["ca.key", "users.yaml", "admin.password", "client.env"]
    for name in [*private, *(f"{node}.key" for node in NODES)]:
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name


def test_client_env_gives_the_cli_the_ca_the_user_and_the_password(
    secrets: tuple[Path, str],
) -> None:
    directory, _ = secrets
    shown = subprocess.run(
        [
            "bash",
            "-c",
            'source "$1" && printf "%s\\n%s\\n" "$PINMQ_TLS_CA" "$PINMQ_USER" '
            '&& printf %s "$PINMQ_PASSWORD" | sha256sum',
            "-",
            str(directory / "client.env"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    password = (directory / "admin.password").read_text().removesuffix("\n")
    assert shown[:2] == [str((directory / "ca.crt").resolve()), "admin"]
    assert shown[2].split()[0] == digest(password)


def test_node_certificates_name_the_compose_services_and_loopback(
    secrets: tuple[Path, str],
) -> None:
    directory, _ = secrets
    ca = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    for node in NODES:
        cert = x509.load_pem_x509_certificate((directory / f"{node}.crt").read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert node in sans.get_values_for_type(x509.DNSName)
        assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
        assert cert.issuer == ca.subject


def test_a_second_run_reuses_everything_and_prints_nothing(secrets: tuple[Path, str]) -> None:
    directory, _ = secrets
    before = contents(directory)
    assert make_secrets(directory) == ""
    assert contents(directory) == before


def test_a_node_whose_files_are_removed_gets_new_ones_from_the_same_ca(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "secrets"
    make_secrets(directory)
    before = contents(directory)
    (directory / "node2.crt").unlink()
    (directory / "node2.key").unlink()
    printed = make_secrets(directory)
    assert (
        printed.strip()
        == f"secrets: certificates for node2 (signed by the CA there) in {directory}/"
    )
    after = contents(directory)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"node2.crt", "node2.key"}
    ca = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((directory / "node2.crt").read_bytes())
    public_key = ca.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    hash_algorithm = cert.signature_hash_algorithm
    assert hash_algorithm is not None
    public_key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hash_algorithm))
