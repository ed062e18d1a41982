"""A few lines of RESP, Valkey's protocol: commands encoded, replies read, one blocking connection
(Connection), and INFO parsed; for devkit.valkey's servers and the store benches."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any


class ValkeyError(RuntimeError):
    """A server could not be found, started, reached or formed into a cluster; the message says why."""


class ReplyError(ValkeyError):
    """The server answered a command with an error reply (-ERR, -CROSSSLOT, -MOVED, ...)."""


def encode_command(args: Sequence[Any]) -> bytes:
    """One command as RESP, the way clients send it."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class Reader:
    """Replies read off a socket, buffered."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.pos = 0

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n", self.pos)) < 0:
            self._more()
        line = bytes(self.buf[self.pos:end])
        self.pos = end + 2
        return line

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        del self.buf[:self.pos]
        self.pos = 0
        self.buf += data

    def reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return ReplyError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < self.pos + n + 2:
                self._more()
            data = bytes(self.buf[self.pos:self.pos + n])
            self.pos += n + 2
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise ValkeyError(f"unexpected reply {line[:40]!r}")


def checked(value: Any) -> Any:
    """`value`, a reply, with any error in it raised as the ReplyError it was read as."""
    if isinstance(value, ReplyError):
        raise value
    if isinstance(value, list):
        return [checked(v) for v in value]
    return value


class Connection:
    """One open connection to a server (after AUTH if it has a password), for callers that send
    many commands: `ValkeyServer.command` opens a new one each time."""

    def __init__(self, sock: socket.socket, password: str | None) -> None:
        self.sock = sock
        self.reader = Reader(sock)
        if password:
            self.command("AUTH", password)

    def command(self, *args: Any) -> Any:
        self.sock.sendall(encode_command(args))
        return checked(self.reader.reply())

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def parse_info(text: bytes | str) -> dict[str, str]:
    """INFO's `key:value` lines as a dict of strings."""
    if isinstance(text, bytes):
        text = text.decode()
    out = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            key, value = line.split(":", 1)
            out[key] = value
    return out
