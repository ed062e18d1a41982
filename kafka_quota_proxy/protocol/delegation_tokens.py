"""Who owns a delegation token, from the messages that say: a CreateDelegationToken response, and
each entry of a DescribeDelegationToken response (KIP-48); and the DescribeDelegationToken request
the proxy makes of its own to ask.

Kafka identifies a client that logged in with a token as the token's owner, so the proxy needs
token id -> owner. Both responses carry each token's HMAC beside its id and owner, and the HMAC is
the token's password: it is dropped here, in the decoder, and goes no further. The owner is the
principal's name alone, as Kafka's DelegationTokenCache.owner gives it (`tokenInfo.owner().getName()`)
to the SCRAM server, whose client is then User:<that name> whatever the owner's principal type.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_quota_proxy.protocol.api_keys import CREATE_DELEGATION_TOKEN, DESCRIBE_DELEGATION_TOKEN
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.headers import (
    PROXY_CLIENT_ID,
    frame_request,
    response_body_offset,
    response_correlation_id,
)
from kafka_quota_proxy.protocol.messages import decode_response

TOKEN_OWNER_APIS = frozenset({CREATE_DELEGATION_TOKEN, DESCRIBE_DELEGATION_TOKEN})
# The lowest version the proxy asks in: Kafka 4 removed v0 (the same layout as v1).
LOWEST_DESCRIBE_VERSION = 1


@dataclass(frozen=True, slots=True)
class TokenOwnersResponse:
    """A response's error code and (token id, owner name) of each token it names, HMACs left out."""

    error_code: int
    owners: tuple[tuple[str, str], ...]


def token_owners(api_key: int, version: int, body: bytes | memoryview) -> TokenOwnersResponse:
    """The owners named in a CreateDelegationToken or DescribeDelegationToken response body.

    An entry with an empty or null id or owner names nobody and is left out; MalformedMessage if
    the body does not decode (or Describe's token array is null, which Kafka never sends)."""
    if api_key not in TOKEN_OWNER_APIS:
        raise ValueError(f"API key {api_key} names no token owners")
    msg = decode_response(api_key, version, body)
    if api_key == CREATE_DELEGATION_TOKEN:
        entries = [(msg.token_id, msg.principal_name)]
    else:
        if msg.tokens is None:
            raise MalformedMessage("DescribeDelegationToken response has a null tokens array")
        entries = [(t.token_id, t.principal_name) for t in msg.tokens]
    owners = tuple((token_id, owner) for token_id, owner in entries
                   if isinstance(token_id, str) and token_id and isinstance(owner, str) and owner)
    return TokenOwnersResponse(int(msg.error_code), owners)


def describe_tokens_request(correlation_id: int, version: int) -> bytes:
    """DescribeDelegationToken for every token the caller may see (a null owners list)."""
    request = codec()[DESCRIBE_DELEGATION_TOKEN].request(owners=None)
    return frame_request(request, version, correlation_id, PROXY_CLIENT_ID)


def describe_tokens_response(frame: bytes, correlation_id: int, version: int) -> TokenOwnersResponse:
    """A framed DescribeDelegationToken response, as the proxy's own request gets it."""
    view = memoryview(frame)
    if response_correlation_id(view) != correlation_id:
        raise MalformedMessage("DescribeDelegationToken response has the wrong correlation id")
    header_version = codec()[DESCRIBE_DELEGATION_TOKEN].response_header_version(version)
    return token_owners(DESCRIBE_DELEGATION_TOKEN, version, view[response_body_offset(view, header_version):])
