"""What `make up` prints once the containers are healthy: the cluster's status as node2 sees it,
each node's client, STOMP and HTTP endpoints on the host, and a first send and consume.

The endpoints are read from `docker compose ps` (the ports as published, whatever the
PINMQ_<NODE>_<CLIENT|STOMP|HTTP>_PORT variables made of them), not assumed. The nodes speak
TLS and clients log in: the status is asked with `make secrets`'s CA and admin password
(from its file, never in argv), and the try line sources its client.env first. Run with the
venv's python, from the repository (`make up` does): `python deploy/endpoints.py [SECRETS]`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROLES = {
    "node1": "LOCAL, ha primary",
    "node1-backup": "its backup",
    "node2": "REMOTE",
    "node3": "REMOTE",
}
HA_ALL_ROLES = {  # docker-compose.ha-all.yml (make up-ha-all): every node a pair
    "node1": "LOCAL, ha primary",
    "node1-backup": "its backup",
    "node2": "REMOTE, ha primary",
    "node2-backup": "its backup",
    "node3": "REMOTE, ha primary",
    "node3-backup": "its backup",
}
PORTS = {"client": 7601, "stomp": 61613, "http": 8161}  # in every container


def published() -> dict[str, dict[str, str]]:
    """Service -> {"client": "127.0.0.1:7601", ...} from `docker compose ps`."""
    listing = subprocess.run(
        ["docker", "compose", "ps", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # One object per line; Compose before 2.21 printed one array.
    text = listing.strip()
    services = json.loads(text) if text.startswith("[") else map(json.loads, text.splitlines())
    found: dict[str, dict[str, str]] = {}
    for service in services:
        by_target = {
            p["TargetPort"]: f"{p['URL'] or '127.0.0.1'}:{p['PublishedPort']}"
            for p in service.get("Publishers") or []
            if p["PublishedPort"]
        }
        found[service["Service"]] = {k: by_target.get(v, "-") for k, v in PORTS.items()}
    return found


def main(argv: list[str]) -> int:
    secrets = Path(argv[1] if len(argv) > 1 else "secrets")  # deploy/dev_secrets.py's
    endpoints = published()
    roles = HA_ALL_ROLES if "node2-backup" in endpoints else ROLES
    missing = sorted(set(roles) - endpoints.keys())
    if missing:
        print(f"not running: {', '.join(missing)} (docker compose ps)", file=sys.stderr)
        return 1
    pinmq = str(Path(sys.executable).parent / "pinmq")
    access = ["--tls-ca", str(secrets / "ca.crt"), "--user", "admin"]
    access += ["--password-file", str(secrets / "admin.password")]
    status = subprocess.run(
        [pinmq, "status", "--cluster", "--url", endpoints["node2"]["client"], *access]
    )
    for name, role in roles.items():
        e = endpoints[name]
        print(
            f"{name:<13} client {e['client']:<16} stomp {e['stomp']:<16} "
            f"http {e['http']:<16} ({role})"
        )
    pair = f"{endpoints['node1']['client']},{endpoints['node1-backup']['client']}"
    print(
        f"try: source {secrets / 'client.env'} && "
        f"pinmq send orders --url {pair} --group g1 --count 5 --body hi && "
        f"pinmq consume orders --url {pair} --count 5 --json"
    )
    return status.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
