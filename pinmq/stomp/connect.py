"""CONNECT (or STOMP) of a session: the protocol version, heart-beats and, with security, the
login: split from `session.py`, whose `Session` it is a part of."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from broker.access import Access
from broker.authenticator import FAILED, Authenticator
from broker.clock import now_ns
from pinmq.stomp.frames import ESCAPING_VERSIONS, Frame, encode_frame, escape
from pinmq.stomp.protocol import (
    SERVER,
    VERSIONS,
    ProtocolError,
    negotiate_heart_beat,
    negotiate_version,
)


class Connecting:
    """The CONNECT frame's part of `Session` (which holds every attribute used here)."""

    version: str | None
    heart_beat: tuple[int, int]
    settings: Any
    parser: Any
    esc_key: Any
    esc_value: Any
    id: str
    peer: str
    _name: str
    _now: int
    certificate: str | None
    access: Access
    authenticator: Authenticator | None

    def fail(
        self, message: str, receipt: str | None = None, headers: dict[str, str] | None = None
    ) -> None: ...

    def refuse(self, reason: str, message: str, receipt: str | None = None) -> None: ...

    def _emit_after(self, gate: Any, item: Any) -> None: ...

    def _connect(self, frame: Frame) -> Awaitable[None] | None:
        if self.version is not None:
            raise ProtocolError("already connected: a second CONNECT/STOMP frame")
        supported = ",".join(VERSIONS)
        version = negotiate_version(frame.headers.get("accept-version"))
        if version is None:
            self.fail(
                f"supported protocol versions are {supported}",
                headers={"version": supported},
            )
            return None
        heart_beat = (
            negotiate_heart_beat(frame.headers.get("heart-beat"), self.settings.heart_beat_ms)
            if version != "1.0"
            else (0, 0)
        )
        self.version, self.heart_beat = version, heart_beat
        if version in ESCAPING_VERSIONS:
            self.parser.escaping = True
            self.esc_key = self.esc_value = escape
        self._name = frame.headers.get("client-id") or f"{self.id}@{self.peer}"
        if self.authenticator is None:
            self._connected()
            return None
        return self._login(self.authenticator, frame)

    async def _login(self, authenticator: Authenticator, frame: Frame) -> None:
        """CONNECT's login and passcode checked (off the loop), or a client certificate's
        subject without a login; one answer to every failure, then close."""
        login = frame.headers.get("login")
        if login is None and self.certificate is not None:
            access = authenticator.certificate(self.certificate, self.peer)
        else:
            access = await authenticator.login(login, frame.headers.get("passcode"), self.peer)
        self._now = now_ns()
        if access is None:
            self.refuse("UNAUTHENTICATED", FAILED)
            return
        self.access = access
        self._connected()

    def _connected(self) -> None:
        assert self.version is not None
        headers = {"version": self.version, "server": SERVER, "session": self.id}
        if self.version != "1.0":
            headers["heart-beat"] = f"{self.heart_beat[0]},{self.heart_beat[1]}"
        self._emit_after(None, encode_frame("CONNECTED", headers, version=self.version))
