"""A node's name can move to another address: a container cut off its network and joined
again gets a fresh IP, and its old one may go to another container. A pinmq channel follows
the name within about a second (broker/channels.py); with gRPC's default of one resolution
per 30 s it kept dialling the old address, where the other container answered for 25 s
(a chaos run: peers refused by TLS as the wrong node, store-and-forward held up).

Real containers of the pinmq image on a network of the test's own: two gRPC servers that
answer with their host name, and a client that calls one of them by name every 0.1 s over
`broker.channels.dial` with the client's options. The two servers trade addresses; the
client must be answered by the right one again within 10 s.
"""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest
import waiting
from compose_nodes import IMAGE, build_image

# an image build (cached), then about 15 s
pytestmark = [pytest.mark.slow, pytest.mark.containers]

SERVER = """
import asyncio, socket, grpc
from grpc import aio
class Name(grpc.GenericRpcHandler):
    def service(self, details):
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: socket.gethostname().encode())
async def main():
    server = aio.server()
    server.add_generic_rpc_handlers((Name(),))
    server.add_insecure_port("0.0.0.0:7000")
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""
CLIENT = """
import asyncio, time, grpc
from broker import channels
from broker.client.base import CHANNEL_OPTIONS
async def main():
    call = channels.dial("srv1:7000", CHANNEL_OPTIONS, None).unary_unary("/name/get")
    while True:
        try:
            answer = (await call(b"", timeout=0.5)).decode()
        except grpc.RpcError as err:
            answer = err.code().name
        print(f"{time.time():.3f} {answer}", flush=True)
        await asyncio.sleep(0.1)
asyncio.run(main())
"""
BACK_WITHIN_S = 10.0  # gRPC's default took 25-30 s


def _docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout


def _answers(container: str) -> list[tuple[float, str]]:
    lines = _docker("logs", container).split()
    return [(float(t), name) for t, name in zip(lines[::2], lines[1::2], strict=True)]


def test_a_channel_follows_a_name_to_its_new_address() -> None:
    image = build_image(IMAGE)
    tag = uuid.uuid4().hex[:8]
    network = f"pinmq-moves-{tag}"
    names = {name: f"pinmq-moves-{tag}-{name}" for name in ("srv1", "srv2", "client")}
    _docker("network", "create", network)
    try:
        for name, script in (("srv1", SERVER), ("srv2", SERVER), ("client", CLIENT)):
            _docker(
                "run", "-d", "--name", names[name], "--hostname", name, "--network", network,
                "--network-alias", name, "--entrypoint", "python3", image, "-c", script,
            )  # fmt: skip
        client = names["client"]
        waiting.wait(
            "srv1 answers the client", lambda: any(n == "srv1" for _, n in _answers(client))
        )

        def address(name: str) -> str:
            ip = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
            return _docker("inspect", "-f", ip, names[name]).strip()

        before = {name: address(name) for name in ("srv1", "srv2")}
        for name in ("srv1", "srv2"):
            _docker("network", "disconnect", network, names[name])
        for name in ("srv2", "srv1"):  # srv2 first: it takes srv1's old address
            _docker("network", "connect", "--alias", name, network, names[name])
        moved = time.time()
        assert (address("srv2"), address("srv1")) == (before["srv1"], before["srv2"])

        def back() -> bool:
            return any(t > moved and n == "srv1" for t, n in _answers(client))

        waiting.wait("srv1 answers again", back, BACK_WITHIN_S + 30, every=0.2)
        after = [(t, n) for t, n in _answers(client) if t > moved]
        returned = next(t for t, n in after if n == "srv1")
        wrong = [n for t, n in after if t < returned and n == "srv2"]
        assert returned - moved < BACK_WITHIN_S, (
            f"srv1 answered again {returned - moved:.1f} s after the move; "
            f"srv2 answered {len(wrong)} calls for it meanwhile"
        )
    finally:
        subprocess.run(
            ["docker", "rm", "-f", "-v", *names.values()], capture_output=True, timeout=60
        )
        subprocess.run(["docker", "network", "rm", network], capture_output=True, timeout=60)
