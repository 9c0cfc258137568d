"""`python -m pinmq.probe HOST:PORT [CA]`: the container health check (deploy/Dockerfile).

With CA (a PEM file; or $PINMQ_PROBE_CA), it asks over HTTPS and trusts that CA.

Healthy (exit 0) when the node's `GET /readyz` answers 200, or when it is a passive ha backup
that follows its active process and holds a full copy (`/readyz` is 503 for it by design: it
serves no clients, yet it is what a healthy pair needs). Otherwise exit 1 with the reasons on
one line. Standard library only: it runs every few seconds in each container.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from typing import Any


def verdict(status: int, body: dict[str, Any]) -> tuple[bool, str]:
    """(healthy, why) from /readyz's status and JSON body."""
    if status == 200:
        return True, "ready"
    ha = body.get("ha") or {}
    if ha.get("replication") == "following" and ha.get("in_sync"):
        return True, f"passive backup in sync with {ha.get('active') or 'its active process'}"
    return False, "; ".join(body.get("reasons") or []) or f"/readyz answered {status}"


def main(argv: list[str]) -> int:
    address = argv[1] if len(argv) > 1 else "127.0.0.1:8161"
    ca = argv[2] if len(argv) > 2 else os.environ.get("PINMQ_PROBE_CA")
    url = f"{'https' if ca else 'http'}://{address}/readyz"
    try:
        context = ssl.create_default_context(cafile=ca) if ca else None
        with urllib.request.urlopen(url, timeout=2, context=context) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    except OSError as err:
        print(f"unhealthy: {address} does not answer ({err})")
        return 1
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    healthy, why = verdict(status, body if isinstance(body, dict) else {})
    print(f"{'healthy' if healthy else 'unhealthy'}: {why}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
