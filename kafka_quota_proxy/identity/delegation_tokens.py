"""Delegation-token clients, identified as Kafka identifies them: token id -> owner.

A client that logs in with SCRAM and Kafka's `tokenauth=true` extension names a delegation
token's id where a user name would be. Kafka identifies it as the token's owner:
ScramSaslServer.evaluateResponse takes the authorization id from
DelegationTokenCredentialCallback.tokenOwner (ScramServerCallbackHandler fills it from
DelegationTokenCache.owner), and SaslServerAuthenticator.principal builds User:<owner> from it
(DefaultKafkaPrincipalBuilder.build) and marks it tokenAuthenticated. So quotas by user apply to
the owner. Only the broker knows the owner: the proxy learns it from the token responses that
pass through it and by asking a broker itself (proxy/token_owners.py). This module is what the
proxy knows and what it has asked, with time passed in.

A token's owner never changes: a renewal keeps the id and the owner, and a token id is a random
UUID, never given to another token. So an owner once learnt is kept, expired token or not, until
the bound pushes it out, the least recently used first. A token id asked for and not found (the
broker's answer did not name it, or no answer came) is not asked for again for `retry_seconds`,
so that a client reconnecting in a loop does not make the proxy ask the broker each time.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

# How long a token id asked for and not found waits before it is asked for again.
RETRY_SECONDS = 30.0
# Token ids remembered, each kind (owners, misses, fallbacks logged): about 2 MB at most.
CAPACITY = 10_000


class TokenOwners:
    """Token id -> owner name, learnt or asked for; which token ids were missed, and when."""

    def __init__(self, retry_seconds: float = RETRY_SECONDS, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.retry_seconds = retry_seconds
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._missed: OrderedDict[str, tuple[float, str]] = OrderedDict()  # token id -> (when, why)
        self._fallbacks: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def owner(self, token_id: str) -> str | None:
        """The owner's principal name, if known."""
        owner = self._owners.get(token_id)
        if owner is not None:
            self._owners.move_to_end(token_id)
        return owner

    def learn(self, token_id: str, owner: str) -> None:
        """A response named the token's owner."""
        if not token_id or not owner:
            return
        self._owners[token_id] = owner
        self._owners.move_to_end(token_id)
        self._missed.pop(token_id, None)
        self._fallbacks.pop(token_id, None)
        _bound(self._owners, self.capacity)

    def may_ask(self, token_id: str, now: float) -> bool:
        """Whether to ask a broker for the token's owner: unknown, and not missed within
        `retry_seconds` of `now`."""
        if token_id in self._owners:
            return False
        missed = self._missed.get(token_id)
        return missed is None or now - missed[0] >= self.retry_seconds

    def missed(self, token_id: str, now: float, why: str) -> None:
        """Asked for at `now` and not found, for the reason `why` (said once in the log)."""
        if token_id in self._owners:
            return
        self._missed.pop(token_id, None)
        self._missed[token_id] = (now, why)
        _bound(self._missed, self.capacity)

    def why_unknown(self, token_id: str) -> str:
        missed = self._missed.get(token_id)
        return missed[1] if missed is not None else "not asked for"

    def first_fallback(self, token_id: str) -> bool:
        """True the first time a connection with this token is identified by the token id for
        want of its owner (the proxy logs that once per token id, not per connection)."""
        if token_id in self._fallbacks:
            self._fallbacks.move_to_end(token_id)
            return False
        self._fallbacks[token_id] = None
        _bound(self._fallbacks, self.capacity)
        return True


def _bound(table: OrderedDict[str, Any], capacity: int) -> None:
    while len(table) > capacity:
        table.popitem(last=False)
