"""Typed protocol errors. Each carries a short `kind` used as a metric label and log field."""

from __future__ import annotations


class ProtocolError(Exception):
    """Input that is not valid Kafka protocol; the connection that sent it must be closed."""

    kind = "protocol_error"


class FrameTooLarge(ProtocolError):
    """A frame longer than `max_frame_bytes`."""

    kind = "frame_too_large"


class NegativeFrameLength(ProtocolError):
    """A size prefix below zero."""

    kind = "negative_frame_length"


class TruncatedMessage(ProtocolError):
    """A header or body that ends before its fields do."""

    kind = "truncated"


class UnknownApiKey(ProtocolError):
    """An API key the codec does not know."""

    kind = "unknown_api_key"


class UnsupportedApiVersion(ProtocolError):
    """A version of a known API that the codec cannot read."""

    kind = "unsupported_api_version"


class MalformedMessage(ProtocolError):
    """Bytes that do not decode as the message they claim to be."""

    kind = "malformed"
