"""AlterClientQuotas and DescribeClientQuotas over one long-lived connection, as an operator's
admin client sends them (kafka-configs.sh sends the same requests; kafka-python builds them from
Kafka's own message schemas)."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

VERSION = 1  # flexible: a response header carries tagged fields
HEADER_BYTES = 5  # correlation id, then an empty tagged-field section


class QuotaAdmin:
    """One connection to the proxy that sends quota requests one at a time; reconnects if the
    connection was lost. `alter` and `describe` raise OSError if the proxy does not answer."""

    def __init__(self, host: str, port: int, client_id: str = "soak-admin") -> None:
        self.address = (host, port)
        self.client_id = client_id
        self.sock: socket.socket | None = None
        self.correlation_id = 0

    def _call(self, request: Any, response_cls: Any) -> Any:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=10)
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id=self.client_id)
        try:
            self.sock.sendall(request.encode(version=VERSION, header=True, framed=True))
            size = struct.unpack(">i", _read(self.sock, 4))[0]
            data = _read(self.sock, size)
        except OSError:
            self.close()
            raise
        if struct.unpack(">i", data[:4])[0] != self.correlation_id:
            self.close()
            raise OSError("response to another request")
        return response_cls.decode(data[HEADER_BYTES:], version=VERSION)

    def alter(self, entity: list[tuple[str, str]], key: str, value: float) -> int:
        """Set one key of one entity; Kafka's error code (0 when it applied)."""
        cls: Any = AlterClientQuotasRequest
        req = cls(entries=[cls.EntryData(
            entity=[cls.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            ops=[cls.EntryData.OpData(key=key, value=value, remove=False)])], validate_only=False)
        return int(self._call(req, AlterClientQuotasResponse).entries[0].error_code)

    def describe(self, client_id: str) -> dict[str, float]:
        """The quotas set on one client-id entity (strict match)."""
        cls: Any = DescribeClientQuotasRequest
        req = cls(components=[cls.ComponentData(entity_type="client-id", match_type=0, match=client_id)],
                  strict=True)
        resp = self._call(req, DescribeClientQuotasResponse)
        return {k: v for e in resp.entries for k, v in e.values}

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _read(sock: socket.socket, n: int) -> bytes:
    data = sock.recv(n, socket.MSG_WAITALL)
    if len(data) != n:
        raise OSError("connection closed by the proxy")
    return data
