"""The three nodes of bench/security.py, side by side: plain, TLS, and TLS with security on.

plain has no `tls` and no `security` (the baseline of every ratio); tls has a development CA's
certificate (`client-auth: none`); secure has both, with a users file holding `admin`
(argon2id; the default roles give `admin` every permission). Each node's `Reach` has the
harness's clients speak TLS to it and log in as it needs.
"""

from __future__ import annotations

import contextlib
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stomp_vs_activemq
from harness.nodes import NodeProc, running_node
from harness.reach import PLAIN, Reach

from broker.tls import TlsFiles
from broker.users import UserEntry, hash_password, write_users
from pinmq.certs import write_certs

VARIANTS = ("plain", "tls", "secure")
LABEL = {"plain": "plain", "tls": "TLS", "secure": "TLS + security"}
USER = "admin"
GROUPS = 100  # the groups of every load: throughput and the burst's steady client


@dataclass(slots=True)
class Variant:
    """One node, and STOMP's TLS to it (the node's `reach` has the rest)."""

    name: str
    node: NodeProc
    context: ssl.SSLContext | None  # None: plain text

    @property
    def stomp(self) -> tuple[str, int]:
        host, port = self.node.listen["stomp"].rsplit(":", 1)
        return host, int(port)


@contextlib.contextmanager
def running_variants(work: Path) -> Iterator[dict[str, Variant]]:
    """The plain, tls and secure nodes serving; certificates and users.yaml under `work`."""
    certs, password = work / "certs", f"bench-{uuid.uuid4().hex}"
    write_certs(certs, ["node"])
    users_file = work / "users.yaml"
    write_users(users_file, {USER: UserEntry(hash_password(password), (USER,))})
    tls_section = {
        "cert": str(certs / "node.crt"),
        "key": str(certs / "node.key"),
        "ca": str(certs / "ca.crt"),
        "client-auth": "none",
    }
    # stomp_vs_activemq's queues wait for its 3 consumers, as in bench/stomp_load/pinmq_node.py.
    settings = {"default-consumers-before-dispatch": stomp_vs_activemq.CONSUMERS}
    base: dict[str, Any] = {
        "address-settings": {"#": {}, stomp_vs_activemq.PATTERN: settings},
        "log": {"format": "json", "level": "warning"},
    }
    extras: dict[str, dict[str, Any]] = {
        "plain": base,
        "tls": {**base, "tls": tls_section},
        "secure": {
            **base,
            "tls": tls_section,
            "security": {"enabled": True, "users-file": str(users_file)},
        },
    }
    tls = TlsFiles(certs / "ca.crt")
    reaches = {"plain": PLAIN, "tls": Reach(tls), "secure": Reach(tls, USER, password)}
    context = ssl.create_default_context(cafile=str(tls.ca))
    with contextlib.ExitStack() as stack:
        variants = {}
        for name in VARIANTS:
            (work / name).mkdir()
            node = stack.enter_context(running_node(work / name, extras[name], reaches[name]))
            variants[name] = Variant(name, node, None if name == "plain" else context)
        yield variants


def rotation(round_: int) -> list[str]:
    """The variants in the order of round `round_` (each one goes first in turn)."""
    k = round_ % len(VARIANTS)
    return [*VARIANTS[k:], *VARIANTS[:k]]


def ratio_text(value: float, base: float) -> str:
    """`value / base` for a report's ratio column ("n/a" without a base)."""
    return f"{value / base:.2f}" if base > 0 else "n/a"
