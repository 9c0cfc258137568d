"""`pinmq user add|remove|list`: the users file of `security.users-file`.

The file is `--users-file PATH`, else the one `--config FILE` (a node's YAML) names, else
`$PINMQ_USERS_FILE`. `add` reads the password from a prompt (twice) on a terminal, else from
the first line of stdin: never from the command line, where `ps` and shell history would
show it. Nodes re-read the file when it changes: no restart needed.

Exit 0 on success, 1 when the action fails (unknown user, unusable file, empty password),
2 when no users file is named or the config cannot be used.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from broker.users import UserEntry, UsersFileError, hash_password, read_users, write_users

ENV = "PINMQ_USERS_FILE"


class _Failed(Exception):
    """The action failed: `str()` is the message, `code` the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def run(args: argparse.Namespace) -> int:
    """Run `pinmq user ACTION`; print what was done, or `pinmq: error: ...` on stderr."""
    try:
        path = users_file(args.users_file, args.config)
        if args.user_verb == "add":
            return _add(path, args.name, args.role)
        if args.user_verb == "remove":
            return _remove(path, args.name)
        return _list(path)
    except _Failed as err:
        print(f"pinmq: error: {err}", file=sys.stderr)
        return err.code
    except UsersFileError as err:
        print(f"pinmq: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def users_file(users_file: str | None, config: str | None) -> Path:
    """The users file: --users-file, else the config's security.users-file, else the env."""
    if users_file:
        return Path(users_file)
    if config:
        from broker.config_file import ConfigError, load_config

        try:
            named = load_config(config).security.users_file
        except ConfigError as err:
            raise _Failed("invalid config:\n  " + "\n  ".join(err.problems), code=2) from None
        if named is None:
            raise _Failed(
                f"{config}: security.users-file is not set: name the users file there "
                "or pass --users-file PATH",
                code=2,
            )
        return named
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    raise _Failed(f"name the users file: --users-file PATH, --config FILE or ${ENV}", code=2)


def _existing(path: Path) -> dict[str, UserEntry]:
    try:
        return read_users(path)
    except UsersFileError:
        if path.exists():
            raise
        return {}  # `add` starts a new file


def _add(path: Path, name: str, roles: list[str]) -> int:
    users = _existing(path)
    password = _read_password()
    known = name in users
    unique = tuple(dict.fromkeys(roles))
    users[name] = UserEntry(hash_password(password), unique)
    write_users(path, users)
    print(f"{'updated' if known else 'added'} user {name!r} (roles: {', '.join(unique)}) in {path}")
    return 0


def _remove(path: Path, name: str) -> int:
    users = read_users(path)
    if users.pop(name, None) is None:
        raise _Failed(f"{path}: no user {name!r}")
    write_users(path, users)
    print(f"removed user {name!r} from {path}")
    return 0


def _list(path: Path) -> int:
    users = read_users(path)
    width = max((len(name) for name in users), default=0)
    for name in sorted(users):
        print(f"{name:<{width}}  {', '.join(users[name].roles) or '-'}")
    return 0


def _read_password() -> str:
    """From a prompt, asked twice, on a terminal; else the first line of stdin."""
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if password and getpass.getpass("password again: ") != password:
            raise _Failed("the passwords do not match")
    else:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    if not password:
        raise _Failed("empty password refused")
    return password
