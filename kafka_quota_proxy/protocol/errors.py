"""Typed protocol errors. Each carries a short `kind` used as a metric label and log field."""

from __future__ import annotations


class ProtocolError(Exception):
    """Input that is not valid Kafka protocol; the connection that sent it must be closed."""

    kind = "protocol_error"


class FrameTooLarge(ProtocolError):
    kind = "frame_too_large"


class NegativeFrameLength(ProtocolError):
    kind = "negative_frame_length"


class TruncatedMessage(ProtocolError):
    kind = "truncated"


class UnknownApiKey(ProtocolError):
    kind = "unknown_api_key"


class UnsupportedApiVersion(ProtocolError):
    kind = "unsupported_api_version"


class MalformedMessage(ProtocolError):
    kind = "malformed"
