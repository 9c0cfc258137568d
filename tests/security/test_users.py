"""The users file (broker/users.py) and `pinmq user`: real files, real argon2id hashes."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from argon2 import PasswordHasher, Type, extract_parameters
from conftest import PINMQ
from structlog.testing import capture_logs

from broker import users as users_module
from broker.users import (
    Principal,
    UserEntry,
    Users,
    UsersFileError,
    hash_password,
    is_argon2id,
    read_users,
    write_users,
)

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def hashed() -> str:
    return hash_password(PASSWORD)  # once: each hash costs tens of milliseconds


@pytest.fixture
def users_file(tmp_path: Path, hashed: str) -> Path:
    path = tmp_path / "users.yaml"
    write_users(path, {"alice": UserEntry(hashed, ("app", "ops"))})
    return path


def test_hash_password_is_argon2id_that_verifies_with_a_fresh_salt() -> None:
    first, second = hash_password("s3cret"), hash_password("s3cret")
    assert first.startswith("$argon2id$") and is_argon2id(first)
    assert extract_parameters(first).type is Type.ID
    assert first != second  # a random salt each time
    assert PasswordHasher().verify(first, "s3cret")
    assert not is_argon2id(PasswordHasher(type=Type.I).hash("s3cret"))  # argon2i: refused
    assert not is_argon2id("$argon2id$garbage")


def test_write_then_read_round_trips_in_the_documented_format(tmp_path: Path, hashed: str) -> None:
    path = tmp_path / "new" / "dir" / "users.yaml"  # parents created
    users = {"zed": UserEntry(hashed, ()), "admin": UserEntry(hashed, ("admin", "ops"))}
    write_users(path, users)
    assert read_users(path) == users
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# pinmq users:")
    assert lines[1] == "users:"
    assert lines[2] == f'  admin: {{password: "{hashed}", roles: [admin, ops]}}'
    assert lines[3] == f'  zed: {{password: "{hashed}", roles: []}}'
    assert yaml.safe_load(text)["users"]["admin"]["roles"] == ["admin", "ops"]
    assert PASSWORD not in text
    assert not list(path.parent.glob(".*.tmp"))  # no temporary file left behind


def test_users_file_is_0600_from_creation_whatever_the_umask(tmp_path: Path, hashed: str) -> None:
    path = tmp_path / "users.yaml"
    path.write_text("users: {}\n")
    path.chmod(0o644)
    old = os.umask(0)
    try:
        write_users(path, {"a": UserEntry(hashed, ("x",))})
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the replaced file: 0600 too
        write_users(tmp_path / "fresh.yaml", {})
        assert stat.S_IMODE((tmp_path / "fresh.yaml").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_user_entry_repr_hides_the_hash(hashed: str) -> None:
    assert hashed not in repr(UserEntry(hashed, ("a",)))


def test_write_users_refuses_what_read_users_would(tmp_path: Path) -> None:
    with pytest.raises(UsersFileError, match="not an argon2id hash"):
        write_users(tmp_path / "u.yaml", {"bob": UserEntry("plain", ("a",))})
    assert not (tmp_path / "u.yaml").exists()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("users: [\n", "invalid YAML"),
        ("", "expected a mapping with one key, 'users'"),
        ("people: {}\n", "expected a mapping with one key, 'users'"),
        ("users: [bob]\n", "'users' must map each user name"),
        ("users:\n  bob: {roles: [a]}\n", "user 'bob': no password hash"),
        ("users:\n  bob: {password: hunter2, roles: [a]}\n", "user 'bob': password is not an"),
        ("users:\n  bob: {password: ARGON2I, roles: [a]}\n", "user 'bob': password is not an"),
        ("users:\n  bob: {password: HASH, roles: admin}\n", "roles must be a list of role names"),
        ("users:\n  bob: {password: HASH, roles: [1]}\n", "roles must be a list of role names"),
        ("users:\n  bob: {password: HASH, role: [a]}\n", "unknown key 'role'"),
        ("users:\n  bob: HASH\n", "user 'bob': expected a mapping"),
        ('users:\n  "": {password: HASH}\n', "user name '': expected a non-empty string"),
        ("users:\n  7: {password: HASH}\n", "user name 7: expected a non-empty string"),
    ],
)
def test_unusable_files_are_named_in_one_line(
    tmp_path: Path, hashed: str, text: str, problem: str
) -> None:
    argon2i = PasswordHasher(type=Type.I).hash("x")
    path = tmp_path / "users.yaml"
    path.write_text(text.replace("HASH", f'"{hashed}"').replace("ARGON2I", f'"{argon2i}"'))
    with pytest.raises(UsersFileError) as caught:
        read_users(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and problem in message and "\n" not in message
    assert "hunter2" not in message and "$argon2" not in message  # no password, no hash


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsersFileError, match=r"users\.yaml: users file not found"):
        read_users(tmp_path / "users.yaml")
    with pytest.raises(UsersFileError, match="not found"):
        Users(tmp_path / "users.yaml")  # a node does not start without its users


def test_users_without_roles_or_under_an_empty_key_are_read(tmp_path: Path, hashed: str) -> None:
    path = tmp_path / "users.yaml"
    path.write_text(f'users:\n  bob: {{password: "{hashed}"}}\n')
    assert read_users(path) == {"bob": UserEntry(hashed, ())}
    path.write_text("users:\n")
    assert read_users(path) == {}


def test_authenticate(users_file: Path) -> None:
    users = Users(users_file)
    assert users.authenticate("alice", PASSWORD) == Principal("alice", frozenset({"app", "ops"}))
    assert users.authenticate("alice", PASSWORD + "x") is None
    assert users.authenticate("alice", "") is None
    assert users.authenticate("alice", None) is None
    assert users.authenticate("mallory", PASSWORD) is None
    assert users.authenticate(None, PASSWORD) is None
    assert users.authenticate("", PASSWORD) is None
    assert users.authenticate(None, None) is None


class _SpyHasher:
    """Records each hash `verify` is given, then verifies for real."""

    def __init__(self) -> None:
        self.real = PasswordHasher()
        self.verified: list[str] = []

    def verify(self, stored: str, password: str) -> bool:
        self.verified.append(stored)
        return self.real.verify(stored, password)


def test_unknown_and_missing_names_cost_a_real_argon2id_verification(
    users_file: Path, monkeypatch: pytest.MonkeyPatch, hashed: str
) -> None:
    users = Users(users_file)
    spy = _SpyHasher()
    monkeypatch.setattr(users_module, "_HASHER", spy)
    for name, password in [("mallory", PASSWORD), (None, PASSWORD), ("alice", None), ("", "x")]:
        assert users.authenticate(name, password) is None
    assert len(spy.verified) == 4  # every refusal verified a hash: none returned early
    dummy = spy.verified[0]
    assert dummy != hashed and is_argon2id(dummy)
    # The same cost as a real user's hash: the same argon2id parameters.
    assert extract_parameters(dummy) == extract_parameters(hashed)
    assert spy.verified == [dummy, dummy, hashed, dummy]


def test_principal_needs_the_user_in_the_file_but_no_password(users_file: Path) -> None:
    users = Users(users_file)
    assert users.principal("alice") == Principal("alice", frozenset({"app", "ops"}))
    assert users.principal("CN=alice") is None
    assert users.principal("mallory") is None
    assert users.names() == ["alice"]


def test_a_changed_file_is_picked_up_without_restart(users_file: Path, hashed: str) -> None:
    users = Users(users_file)
    assert users.authenticate("bob", "bobs password") is None
    entries = read_users(users_file)
    entries["bob"] = UserEntry(hash_password("bobs password"), ("worker",))
    write_users(users_file, entries)
    assert users.authenticate("bob", "bobs password") == Principal("bob", frozenset({"worker"}))
    # Roles and password changed, alice removed.
    write_users(users_file, {"bob": UserEntry(hash_password("new one"), ("ops", "admin"))})
    assert users.authenticate("bob", "bobs password") is None
    assert users.authenticate("bob", "new one") == Principal("bob", frozenset({"ops", "admin"}))
    assert users.authenticate("alice", PASSWORD) is None
    assert users.principal("alice") is None


def test_an_unusable_rewrite_keeps_the_last_good_users_and_warns_once(
    users_file: Path, hashed: str
) -> None:
    users = Users(users_file)
    with capture_logs() as logged:
        users_file.write_text(f'users:\n  alice: {{password: "{hashed}", roles: admin}}\n')
        for _ in range(3):
            assert users.principal("alice") == Principal("alice", frozenset({"app", "ops"}))
        assert users.authenticate("alice", PASSWORD) is not None
        users_file.write_text("users:\n  alice: {password: hunter2}\n")  # another problem
        for _ in range(3):
            assert users.principal("alice") is not None
        users_file.unlink()  # a third: the file is gone
        assert users.authenticate("alice", PASSWORD) is not None
        assert users.names() == ["alice"]
    warnings = [e for e in logged if e["log_level"] == "warning"]
    assert [("roles must be a list" in w["problem"]) for w in warnings] == [True, False, False]
    assert "password is not an argon2id hash" in warnings[1]["problem"]
    assert "users file not found" in warnings[2]["problem"]
    assert all(w["path"] == str(users_file) for w in warnings)
    assert "hunter2" not in repr(logged) and "$argon2" not in repr(logged)
    # Fixed: the new file is used again, and a later problem is reported anew.
    with capture_logs() as logged:
        write_users(users_file, {"carol": UserEntry(hashed, ("ops",))})
        assert users.authenticate("carol", PASSWORD) == Principal("carol", frozenset({"ops"}))
        assert users.principal("alice") is None
        users_file.write_text("users: [\n")
        assert users.principal("carol") is not None
        assert users.principal("carol") is not None
    assert [e["log_level"] for e in logged] == ["info", "warning"]


# `pinmq user`, as an operator runs it.


def pinmq_user(
    *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PINMQ_USERS_FILE"} | (env or {})
    return subprocess.run(
        [*PINMQ, "user", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
    )


def test_cli_add_list_update_remove(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "users.yaml"
    where = ["--users-file", str(path)]
    outputs: list[str] = []

    def ok(*args: str, stdin: str = "") -> str:
        done = pinmq_user(*args, *where, stdin=stdin)
        outputs.extend([done.stdout, done.stderr])
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        return done.stdout

    assert "added user 'alice' (roles: app, ops)" in ok(
        "add", "alice", "--role", "app", "--role", "ops", stdin="pass word one\n"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "added user 'bob'" in ok("add", "bob", "--role", "worker", stdin="bobpw\nignored\n")
    users = Users(path)  # an existing reader sees the CLI's changes
    assert users.authenticate("alice", "pass word one") == Principal(
        "alice", frozenset({"app", "ops"})
    )
    assert users.authenticate("bob", "bobpw") is not None  # the first line only
    listed = ok("list")
    assert listed.splitlines() == ["alice  app, ops", "bob    worker"]

    assert "updated user 'alice' (roles: admin)" in ok(
        "add", "alice", "--role", "admin", stdin="second\n"
    )
    assert users.authenticate("alice", "pass word one") is None
    assert users.authenticate("alice", "second") == Principal("alice", frozenset({"admin"}))

    assert "removed user 'bob'" in ok("remove", "bob")
    assert ok("list").splitlines() == ["alice  admin"]
    assert users.authenticate("bob", "bobpw") is None

    everything = "".join(outputs) + path.read_text()
    for secret in ("pass word one", "bobpw", "second"):
        assert secret not in everything
    assert "$argon2" not in "".join(outputs)  # list (and the rest) never show a hash


def test_cli_refusals(tmp_path: Path, hashed: str) -> None:
    path = tmp_path / "users.yaml"
    where = ["--users-file", str(path)]

    empty = pinmq_user("add", "alice", "--role", "a", *where, stdin="\n")
    assert (empty.returncode, empty.stderr) == (1, "pinmq: error: empty password refused\n")
    assert pinmq_user("add", "alice", "--role", "a", *where).returncode == 1  # stdin at EOF
    assert not path.exists()

    for action in (["list"], ["remove", "alice"]):
        missing = pinmq_user(*action, *where)
        assert missing.returncode == 1
        assert missing.stderr == f"pinmq: error: {path}: users file not found\n"

    write_users(path, {"alice": UserEntry(hashed, ("a",))})
    unknown = pinmq_user("remove", "bob", *where)
    assert (unknown.returncode, unknown.stderr) == (1, f"pinmq: error: {path}: no user 'bob'\n")

    path.write_text("users:\n  alice: {password: plain}\n")  # hand-edited wrong: left alone
    broken = pinmq_user("add", "bob", "--role", "a", *where, stdin="pw\n")
    assert broken.returncode == 1 and "not an argon2id hash" in broken.stderr
    assert path.read_text() == "users:\n  alice: {password: plain}\n"

    # Usage: exit 2.
    nowhere = pinmq_user("list")
    assert nowhere.returncode == 2 and "--users-file PATH, --config FILE" in nowhere.stderr
    assert pinmq_user("add", "alice", *where, stdin="pw\n").returncode == 2  # no --role
    both = pinmq_user("list", *where, "--config", str(tmp_path / "node.yaml"))
    assert both.returncode == 2 and "not allowed with" in both.stderr
    assert pinmq_user("add", "alice", "--role", "", *where, stdin="pw\n").returncode == 2
    assert pinmq_user("add", "alice", "pw", "--role", "a", *where).returncode == 2  # no argv pw


def test_cli_finds_the_users_file_through_the_config_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"node": {"id": "n1"}, "security": {"users-file": str(path)}}))
    added = pinmq_user("add", "alice", "--role", "app", "--config", str(config), stdin="pw\n")
    assert added.returncode == 0, added.stderr
    assert set(read_users(path)) == {"alice"}

    listed = pinmq_user("list", env={"PINMQ_USERS_FILE": str(path)})
    assert (listed.returncode, listed.stdout) == (0, "alice  app\n")
    # --users-file wins over the environment.
    other = pinmq_user(
        "list", "--users-file", str(tmp_path / "other.yaml"), env={"PINMQ_USERS_FILE": str(path)}
    )
    assert other.returncode == 1 and "other.yaml: users file not found" in other.stderr

    config.write_text(yaml.safe_dump({"node": {"id": "n1"}}))
    unset = pinmq_user("list", "--config", str(config))
    assert unset.returncode == 2
    assert unset.stderr.startswith(f"pinmq: error: {config}: security.users-file is not set")

    config.write_text(yaml.safe_dump({"node": {"id": "n1"}, "security": {"enabld": True}}))
    invalid = pinmq_user("list", "--config", str(config))
    assert invalid.returncode == 2
    assert "pinmq: error: invalid config:" in invalid.stderr and "enabld" in invalid.stderr
