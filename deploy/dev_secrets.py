"""`make secrets` (run by `make up` and `make test`): the development secrets of the shipped
cluster, in a git-ignored directory (`secrets/` at the repository root), made with pinmq's own
commands the first time and reused after that:

- a development CA and a key and certificate per node (`pinmq certs`): `ca.crt`, `ca.key`,
  `<node>.crt`, `<node>.key`. A node certificate names the node (the compose service of that
  name), `localhost`, 127.0.0.1 and ::1. A node whose files are missing gets new ones from the
  same CA (`--reuse-ca`): that is how one is rotated.
- the users file `users.yaml` with the user `admin` (role `admin`), whose random password
  (`pinmq user add`, fed on stdin: never in argv) is kept in `admin.password` (mode 0600) and
  shown once, on a terminal, when it is made.
- `client.env`, for the shell (`source secrets/client.env`): PINMQ_TLS_CA (absolute),
  PINMQ_USER and PINMQ_PASSWORD, the settings of the `pinmq` CLI. Mode 0600.

Nothing is printed when everything is there already. Run with the venv's python from the
repository: `python deploy/dev_secrets.py [DIR]` (DIR: `secrets`). Several at once (test workers)
take turns: the directory is locked while it is checked and filled.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from broker.atomic_file import write_atomically

NODES = ("node1", "node1-backup", "node2", "node2-backup", "node3", "node3-backup")
USER = ROLE = "admin"
USERS_FILE = "users.yaml"
PASSWORD_FILE = f"{USER}.password"
CLIENT_ENV = "client.env"
FILES = ("crt", "key")  # of each node
PINMQ = [sys.executable, "-m", "pinmq.cli"]


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """`directory` (created 0700 if missing) held by this process alone."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


def pinmq(*args: str, stdin: str | None = None) -> None:
    """Run a pinmq command; its error (never a secret: only names and paths) ends this one."""
    done = subprocess.run([*PINMQ, *args], input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"secrets: pinmq {args[0]} failed:\n{done.stderr.strip()}")


def certificates(directory: Path) -> str | None:
    """The CA and every node's key and certificate; what was made, if anything."""
    missing = [n for n in NODES if not all((directory / f"{n}.{x}").exists() for x in FILES)]
    if not missing:
        return None
    has_ca = (directory / "ca.crt").exists() or (directory / "ca.key").exists()
    reuse = ["--reuse-ca"] if has_ca else []
    pinmq("certs", str(directory), "--nodes", ",".join(missing), *reuse)
    made = f"certificates for {', '.join(missing)}"
    return made + (" (signed by the CA there)" if has_ca else " and a development CA")


def admin_password(directory: Path) -> tuple[str, bool]:
    """The admin's password and whether it is new: kept in admin.password, and in the users
    file as a hash (added again from the kept one if the users file went missing)."""
    users, kept = directory / USERS_FILE, directory / PASSWORD_FILE
    if kept.exists():
        password = kept.read_text(encoding="utf-8").splitlines()[0]
        if not users.exists():
            pinmq("user", "add", USER, "--role", ROLE, "--users-file", str(users), stdin=password)
            print(f"secrets: user {USER} added to a new {users}, with the password in {kept}")
        return password, False
    password = secrets.token_urlsafe(18)  # 24 characters, 144 random bits
    pinmq("user", "add", USER, "--role", ROLE, "--users-file", str(users), stdin=password)
    write_atomically(kept, (password + "\n").encode())
    return password, True


def client_env(directory: Path, password: str) -> bool:
    """Write client.env if it is missing or says something else; whether it was written."""
    path = directory / CLIENT_ENV
    text = (
        "# The pinmq CLI's settings for the `make up` cluster (written by `make secrets`):\n"
        "# source it in the shell that runs pinmq. It holds a password: keep it private.\n"
        f"export PINMQ_TLS_CA={shlex.quote(str((directory / 'ca.crt').resolve()))}\n"
        f"export PINMQ_USER={USER}\n"
        f"export PINMQ_PASSWORD={shlex.quote(password)}\n"
    )
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    write_atomically(path, text.encode())
    return True


def main(argv: list[str]) -> int:
    directory = Path(argv[1] if len(argv) > 1 else "secrets")
    with locked(directory):
        made = certificates(directory)
        password, new = admin_password(directory)
        env_written = client_env(directory, password)
    if made:
        print(f"secrets: {made} in {directory}/")
    if new:
        where = directory / PASSWORD_FILE
        if sys.stdout.isatty():
            print(f"secrets: user {USER}, password {password} (shown once; kept in {where})")
        else:
            print(f"secrets: a new password for user {USER} is in {where} (mode 0600)")
    if env_written:
        print(f"secrets: the CLI's settings: source {directory / CLIENT_ENV}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
