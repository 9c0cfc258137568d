"""A TCP proxy the tests control, to cut a link between two processes on one machine.

`Proxy(target)` listens on a loopback port of its own and forwards every connection to
`target`, both ways, on a thread. `cut()` drops every live connection and refuses new ones
(accepted, then closed at once) until `heal()`.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

from ports import reserve_port


class Proxy:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.port = reserve_port()
        self.address = f"127.0.0.1:{self.port}"
        self._listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._listener.setblocking(False)
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"proxy:{self.port}", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """From now on nothing passes; live connections drop within 50 ms."""
        self._cut.set()

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(5)
        self._listener.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        peers: dict[socket.socket, socket.socket] = {}
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept(sel, peers)
                    continue
                other = peers.get(sock)
                try:
                    data = sock.recv(65536)
                    if data and other is not None and not self._cut.is_set():
                        other.sendall(data)
                        continue
                except OSError:
                    pass
                self._drop(sel, peers, sock)
            if self._cut.is_set():
                for sock in list(peers):
                    self._drop(sel, peers, sock)
        for sock in list(peers):
            self._drop(sel, peers, sock)
        sel.close()

    def _accept(
        self, sel: selectors.BaseSelector, peers: dict[socket.socket, socket.socket]
    ) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        if self._cut.is_set():
            client.close()
            return
        try:
            server = socket.create_connection(self.target, timeout=1)
        except OSError:
            client.close()
            return
        for s in (client, server):
            s.setblocking(True)
            sel.register(s, selectors.EVENT_READ, None)
        peers[client], peers[server] = server, client

    def _drop(
        self,
        sel: selectors.BaseSelector,
        peers: dict[socket.socket, socket.socket],
        sock: socket.socket,
    ) -> None:
        other = peers.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            peers.pop(s, None)
            with contextlib.suppress(KeyError, ValueError, OSError):
                sel.unregister(s)
            with contextlib.suppress(OSError):
                s.close()
