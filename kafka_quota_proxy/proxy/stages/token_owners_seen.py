"""Delegation tokens' owners learnt from the responses passing by: a CreateDelegationToken response
names the new token's owner, a DescribeDelegationToken response each listed token's. A token
created through the proxy is then known before a client first logs in with it, and the proxy
need not ask the broker. Passthrough only: in terminate mode no client logs in with a token.
The response goes on unchanged; one that does not decode is the client's to judge."""

from __future__ import annotations

from kafka_quota_proxy.protocol.delegation_tokens import TOKEN_OWNER_APIS, token_owners
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import ResponseStage
from kafka_quota_proxy.proxy.token_owners import TokenOwnerLookup


class TokenOwnersSeen(ResponseStage):
    """Learns token id -> owner from the token responses clients get."""

    api_keys = TOKEN_OWNER_APIS

    def __init__(self, tokens: TokenOwnerLookup) -> None:
        self.tokens = tokens

    def on_response(self, ctx: RequestContext, body: memoryview) -> None:
        try:
            answer = token_owners(ctx.api_key, ctx.broker_version, body)
        except ProtocolError:
            return None
        if answer.error_code == 0:
            self.tokens.learn(answer.owners)
        return None
