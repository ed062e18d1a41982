"""Delegation tokens' owners, asked of a broker by the proxy as its own user.

A client logged in with a delegation token is its owner to Kafka (identity/delegation_tokens.py),
and only the broker knows the owner. Kafka refuses DescribeDelegationToken on a connection that
authenticated with a token (KafkaApis.allowTokenRequests: DELEGATION_TOKEN_REQUEST_NOT_ALLOWED),
so the client's own connection cannot ask: the proxy asks on a connection of its own, logged in
with `upstream_sasl`, as its metadata refresh is. DescribeDelegationToken has no token-id filter,
so one answer lists every token that user may see (KafkaApis.handleDescribeTokensRequest,
DelegationTokenManager.filterToken: its own, those it renews, those it has Describe on, and those
of owners it has DescribeTokens on), and every owner in it is learnt.

Asks are coalesced: one runs at a time, and every token id wanting an answer meanwhile waits
for the next one, which starts when the running one ends (a token id must be asked about by an
ask that began after the broker accepted it). Each ask ends within connect_timeout_seconds, and
every waiter gets an answer, the owner or None, whatever happens, shutdown included.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import kafka.errors

from kafka_quota_proxy.config import HostPort
from kafka_quota_proxy.config.identity_settings import UpstreamSaslSettings
from kafka_quota_proxy.identity.delegation_tokens import TokenOwners
from kafka_quota_proxy.protocol import bootstrap
from kafka_quota_proxy.protocol.api_keys import DESCRIBE_DELEGATION_TOKEN
from kafka_quota_proxy.protocol.delegation_tokens import (
    LOWEST_DESCRIBE_VERSION,
    TokenOwnersResponse,
    describe_tokens_request,
    describe_tokens_response,
)
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.proxy.upstream_auth import open_upstream, read_frame

log = logging.getLogger("kafka_quota_proxy.sasl")

NO_LOGIN = "upstream_sasl is not set, so the proxy has no login of its own to ask the broker with"


class LookupFailed(Exception):
    """No broker told the proxy who owns which token; the message says why, without secrets."""


async def describe_tokens(target: HostPort, ssl_ctx: ssl.SSLContext | None,
                          creds: UpstreamSaslSettings) -> TokenOwnersResponse:
    """Every token `creds` may see, with its owner, asked of the broker at `target`."""
    reader, writer = await open_upstream(target.host, target.port, ssl_ctx, creds)
    try:
        writer.write(bootstrap.api_versions_request(1))
        version = bootstrap.usable_version(await read_frame(reader), 1, DESCRIBE_DELEGATION_TOKEN,
                                           LOWEST_DESCRIBE_VERSION)
        writer.write(describe_tokens_request(2, version))
        return describe_tokens_response(await read_frame(reader), 2, version)
    finally:
        writer.close()


async def ask_token_owners(targets: Callable[[], Sequence[HostPort]], ssl_ctx: ssl.SSLContext | None,
                           creds: UpstreamSaslSettings) -> list[tuple[str, str]]:
    """(token id, owner) of every token the proxy's user may see, from the first broker that
    answers; LookupFailed if none does, or if one refuses."""
    errors: list[str] = []
    for target in targets():
        try:
            answer = await describe_tokens(target, ssl_ctx, creds)
        except (OSError, ProtocolError) as exc:
            errors.append(f"{target}: {exc or type(exc).__name__}")
            continue
        if answer.error_code:
            name = kafka.errors.for_code(answer.error_code).__name__
            raise LookupFailed(f"the broker at {target} refused the proxy's DescribeDelegationToken "
                               f"as user {creds.username!r}: {name} (error {answer.error_code})")
        return list(answer.owners)
    raise LookupFailed("no broker answered the proxy's DescribeDelegationToken: "
                       + ("; ".join(errors) or "no broker address known"))


Ask = Callable[[], Awaitable[list[tuple[str, str]]]]


class TokenOwnerLookup:
    """Token id -> owner: what the proxy knows, and asks of a broker when it does not."""

    def __init__(self, owners: TokenOwners, ask: Ask | None,
                 spawn: Callable[[Coroutine[Any, Any, None]], bool], clock: Callable[[], float],
                 timeout: float, asker: str = "") -> None:
        self.owners = owners
        self._ask = ask  # None: the proxy has no login of its own (no upstream_sasl)
        self._spawn = spawn
        self._clock = clock
        self.timeout = timeout
        self.asker = asker  # the user the proxy asks as, for the log
        self._asking: dict[str, asyncio.Future[str | None]] = {}  # in the running ask
        self._next: dict[str, asyncio.Future[str | None]] = {}  # for the ask after it
        self._running = False

    def known(self, token_id: str) -> str | None:
        return self.owners.owner(token_id)

    def learn(self, owners: Sequence[tuple[str, str]]) -> None:
        for token_id, owner in owners:
            self.owners.learn(token_id, owner)

    def why_unknown(self, token_id: str) -> str:
        return NO_LOGIN if self._ask is None else self.owners.why_unknown(token_id)

    def find(self, token_id: str) -> asyncio.Future[str | None] | None:
        """A future of the token's owner (None if the broker did not say), or None when it is
        not to be asked for now: no login, or asked and missed within the retry time."""
        # Already waiting: a token id is looked for only once the broker has accepted it (its
        # first SCRAM round), so any ask it waits for began after that.
        waiting = self._asking.get(token_id) or self._next.get(token_id)
        if waiting is not None:
            return waiting
        if self._ask is None or not self.owners.may_ask(token_id, self._clock()):
            return None
        found: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._next[token_id] = found
        if not self._running:
            self._start()
        return found

    def _start(self) -> None:
        self._asking, self._next = self._next, {}
        self._running = True
        if not self._spawn(self._round(self._asking)):  # the proxy is shutting down
            self._finish(self._asking, None, "the proxy is shutting down")

    async def _round(self, batch: dict[str, asyncio.Future[str | None]]) -> None:
        assert self._ask is not None
        owners: list[tuple[str, str]] | None = None
        why = "the proxy is shutting down"
        try:
            async with asyncio.timeout(self.timeout):  # not wait_for (see cluster.py)
                owners = await self._ask()
        except TimeoutError:
            why = f"no broker answered the proxy's DescribeDelegationToken within {self.timeout:g} s"
        except LookupFailed as exc:
            why = str(exc)
        except Exception as exc:  # a bug, not the broker's answer: every waiter still gets one
            log.exception("asking the broker for delegation tokens' owners failed")
            why = f"the proxy's DescribeDelegationToken failed ({type(exc).__name__})"
        finally:  # and at shutdown (cancelled), too
            self._finish(batch, owners, why)

    def _finish(self, batch: dict[str, asyncio.Future[str | None]],
                owners: list[tuple[str, str]] | None, why: str) -> None:
        if owners is not None:
            # The tokens asked for last, so that the bound pushes out others before them.
            self.learn([pair for pair in owners if pair[0] not in batch])
            self.learn([pair for pair in owners if pair[0] in batch])
            why = (f"not among the {len(owners)} tokens the broker describes to the proxy's user "
                   f"{self.asker!r} (it needs Describe on the token, or DescribeTokens on its owner)")
            log.debug("learnt the owners of %d delegation tokens", len(owners))
        now = self._clock()
        for token_id, found in batch.items():
            owner = self.owners.owner(token_id)
            if owner is None:
                self.owners.missed(token_id, now, why)
            if not found.done():
                found.set_result(owner)
        self._running = False
        self._asking = {}
        if self._next:
            self._start()
