"""The users file (`security.users-file`): user names, argon2id password hashes and roles.

The file is YAML, written by `pinmq user` and readable by people::

    # pinmq users: written by `pinmq user`; passwords are argon2id hashes
    users:
      admin: {password: "$argon2id$v=19$...", roles: [admin]}

`read_users` / `write_users` read and write it (atomically, mode 0600). `Users` is what a node
holds: it authenticates a name and password, re-reading the file when it changes, and keeps
the last good users when a changed file cannot be used. No password or hash is ever logged or
put in an error message.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from argon2 import PasswordHasher, Type, extract_parameters
from argon2.exceptions import InvalidHashError, VerificationError

from broker import logs
from broker.atomic_file import write_atomically

log = logs.get("security")

HEADER = "# pinmq users: written by `pinmq user`; passwords are argon2id hashes\n"
_ARGON2ID = "$argon2id$"
_HASHER = PasswordHasher(type=Type.ID)  # argon2-cffi's defaults (RFC 9106's low-memory choice)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated user: the name and the roles the users file gives it."""

    name: str
    roles: frozenset[str]


@dataclass(frozen=True, slots=True)
class UserEntry:
    """One user of the file: its password hash (argon2id) and its roles, in file order."""

    password: str = field(repr=False)  # never in a log line by accident
    roles: tuple[str, ...] = ()


class UsersFileError(Exception):
    """A users file that cannot be used; `str()` is one line naming the file and the problem."""


def hash_password(password: str) -> str:
    """An argon2id hash of `password` (argon2-cffi's default parameters, a random salt)."""
    return _HASHER.hash(password)


def read_users(path: str | Path) -> dict[str, UserEntry]:
    """Read and validate a users file: user name -> entry, or `UsersFileError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsersFileError(f"{path}: users file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise UsersFileError(f"{path}: cannot read users file: {reason}") from None
    return parse_users(text, str(path))


def parse_users(text: str, source: str) -> dict[str, UserEntry]:
    """Validate the text of a users file; `source` names it (the path) in error messages."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        # Only the position and the parser's own words: a snippet could hold a hash.
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise UsersFileError(f"{where}: invalid YAML: {getattr(err, 'problem', None)}") from None
    if not isinstance(data, dict) or set(data) != {"users"}:
        raise UsersFileError(f"{source}: expected a mapping with one key, 'users'")
    users = data["users"]
    if users is None:  # `users:` with nothing under it
        return {}
    if not isinstance(users, dict):
        raise UsersFileError(f"{source}: 'users' must map each user name to its entry")
    return {_name(source, name): _entry(source, name, entry) for name, entry in users.items()}


def _name(source: str, name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise UsersFileError(f"{source}: user name {name!r}: expected a non-empty string")
    return name


def _entry(source: str, name: str, entry: Any) -> UserEntry:
    where = f"{source}: user {name!r}"
    if not isinstance(entry, dict):
        raise UsersFileError(f"{where}: expected a mapping with 'password' and 'roles'")
    unknown = sorted(str(key) for key in entry if key not in ("password", "roles"))
    if unknown:
        raise UsersFileError(f"{where}: unknown key {unknown[0]!r} (expected password, roles)")
    password = entry.get("password")
    if password is None:
        raise UsersFileError(f"{where}: no password hash (set one with `pinmq user add`)")
    if not is_argon2id(password):  # the value is never shown: it may be a plain password
        raise UsersFileError(
            f"{where}: password is not an argon2id hash (set one with `pinmq user add`)"
        )
    roles = entry.get("roles", [])
    if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles):
        raise UsersFileError(f"{where}: roles must be a list of role names (strings)")
    return UserEntry(password, tuple(roles))


def is_argon2id(value: object) -> bool:
    """Whether `value` is a well-formed argon2id hash string (PHC format)."""
    if not isinstance(value, str) or not value.startswith(_ARGON2ID):
        return False
    try:
        extract_parameters(value)
    except (InvalidHashError, ValueError):
        return False
    return True


class _Quoted(str):
    """A string the YAML writer puts in double quotes (a hash: `$`, `,` and `=` inside)."""


class _Flow(dict):
    """A mapping the YAML writer puts on one line: `{password: "...", roles: [a, b]}`."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(
    _Quoted, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", str(v), style='"')
)
_Dumper.add_representer(
    _Flow, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v, flow_style=True)
)


def render_users(users: Mapping[str, UserEntry]) -> str:
    """The text of a users file holding `users` (sorted by name, one line each)."""
    body = {
        name: _Flow(password=_Quoted(entry.password), roles=list(entry.roles))
        for name, entry in sorted(users.items())
    }
    text = yaml.dump(
        {"users": body},
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 20,  # never fold a user's line
    )
    return HEADER + text


def write_users(path: str | Path, users: Mapping[str, UserEntry]) -> None:
    """Write a users file atomically (`write_atomically`, mode 0600).

    A reader sees the old file or the new one, never a part; the directory is created if
    missing.
    """
    target = Path(path)
    for name, entry in users.items():  # never write what read_users would refuse
        fields = {"password": entry.password, "roles": list(entry.roles)}
        _entry(str(target), _name(str(target), name), fields)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, render_users(users).encode("utf-8"))


@cache
def _dummy_hash() -> str:
    """A hash of a random password no one knows, with the parameters real hashes have.

    Verifying against it costs what verifying a real user's password costs, so an unknown
    name takes as long to refuse as a wrong password.
    """
    return hash_password(secrets.token_urlsafe(32))


class Users:
    """The users of a users file, re-read when the file changes.

    Construction reads the file and raises `UsersFileError` if it cannot be used. After
    that, each call compares the file's (mtime, size, inode) with what was last read and
    re-reads it when they differ; a changed file that cannot be used is logged once per
    distinct problem and the last good users stay in force.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._users = read_users(self.path)
        self._problem: str | None = None
        self._generation = 0  # grows with every re-read that changed the users in force
        _dummy_hash()  # computed now, not on the first unknown name

    def authenticate(self, name: str | None, password: str | None) -> Principal | None:
        """The user `name` if `password` is its password, else None.

        A missing name or password, an unknown user and a wrong password all give None, and
        take about as long (an argon2 verification each), so timing does not tell which
        names exist. Deliberately CPU-heavy (argon2, tens of milliseconds) and synchronous:
        call it from a thread (`await asyncio.to_thread(users.authenticate, name, password)`),
        never on the event loop.
        """
        self._refresh()
        entry = self._users.get(name) if name else None
        stored = entry.password if entry is not None else _dummy_hash()
        try:
            _HASHER.verify(stored, password if password is not None else "")
        except (VerificationError, InvalidHashError):
            return None
        if entry is None or name is None or password is None:
            return None
        return Principal(name, frozenset(entry.roles))

    def principal(self, name: str) -> Principal | None:
        """The user `name` without a password check (a client certificate's subject), or None.

        The user must be in the file: a certificate alone makes no one a user.
        """
        self._refresh()
        entry = self._users.get(name)
        return None if entry is None else Principal(name, frozenset(entry.roles))

    def generation(self) -> int:
        """A number that changes whenever the users in force change (re-reading if needed):
        what a cache of authenticated users compares to drop what the file no longer says."""
        self._refresh()
        return self._generation

    def names(self) -> list[str]:
        """The user names, sorted."""
        self._refresh()
        return sorted(self._users)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _refresh(self) -> None:
        stamp = self._stat()
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:  # another thread re-read it meanwhile
                return
            try:
                users = read_users(self.path)
            except UsersFileError as err:
                problem = str(err)
                if problem != self._problem:
                    self._problem = problem
                    log.warning(
                        "users file unusable: keeping the users last read",
                        path=str(self.path),
                        problem=problem,
                        users=len(self._users),
                    )
            else:
                self._users = users
                self._generation += 1
                if self._problem is not None:
                    log.info("users file usable again", path=str(self.path), users=len(users))
                self._problem = None
            self._stamp = stamp
