"""The client side of SASL, for the proxy's own service credentials towards the brokers.

Pure: `first()` is the token for the first SaslAuthenticate request, `step(server_bytes)` turns
each response's auth bytes into the next token, or None once the exchange is complete. A broker
that rejects the login says so with an error code in SaslAuthenticate, which the connection code
sees; this class only sees tokens.

PLAIN sends "\\0user\\0password" as Kafka's PlainLoginModule does. SCRAM-SHA-256/512 run on
scramp's ScramClient, which checks the server's nonce and, at the end, the server signature: a
broker that does not know the password cannot complete the exchange.
"""

from __future__ import annotations

from scramp import ScramClient, ScramException
from scramp.utils import saslprep

from kafka_quota_proxy.identity.credentials import PLAIN, SCRAM_MECHANISMS

CLIENT_MECHANISMS: tuple[str, ...] = (PLAIN, *SCRAM_MECHANISMS)

# Kafka brokers use 4096..16384. A broker asking for far more would make the proxy burn seconds
# of CPU per connection, so such a request is refused rather than obeyed.
DEFAULT_MAX_ITERATIONS = 65_536


class SaslClientError(Exception):
    """The broker's side of the exchange was invalid: a bad nonce or signature, an error reply,
    or an absurd iteration count. The message never contains the password."""

    kind = "sasl_client"


class SaslClient:
    """One client-side SASL exchange; build a new one for every connection."""

    __slots__ = ("mechanism", "_username", "_password", "_scram", "_max_iterations", "_state")

    def __init__(self, mechanism: str, username: str, password: str, *,
                 max_iterations: int = DEFAULT_MAX_ITERATIONS) -> None:
        if mechanism not in CLIENT_MECHANISMS:
            raise ValueError(f"unsupported SASL mechanism {mechanism!r}; "
                             f"supported: {', '.join(CLIENT_MECHANISMS)}")
        if not username or not password:
            raise ValueError("the SASL user name and password must not be empty")
        if mechanism == PLAIN and ("\x00" in username or "\x00" in password):
            raise ValueError("a SASL/PLAIN user name or password cannot contain NUL")
        self.mechanism = mechanism
        self._username = username
        self._password = password
        self._max_iterations = max_iterations
        self._state = "start"  # start -> first_sent -> (final_sent ->) done, or failed
        self._scram: ScramClient | None = None
        if mechanism != PLAIN:
            # scramp normalises both with SASLprep, Kafka brokers do not: they agree only when
            # SASLprep changes nothing, so anything else would fail at the broker for no clear reason.
            if not (_saslprep_stable(username) and _saslprep_stable(password)):
                raise ValueError("the SASL user name or password changes under SASLprep, which Kafka "
                                 "brokers do not apply; SCRAM with it would fail")
            self._scram = ScramClient([mechanism], username, password)

    @property
    def done(self) -> bool:
        return self._state == "done"

    def first(self) -> bytes:
        """The client's first token."""
        if self._state != "start":
            raise RuntimeError("first() was already called")
        self._state = "first_sent"
        if self._scram is None:
            return b"\x00" + self._username.encode("utf-8") + b"\x00" + self._password.encode("utf-8")
        return self._scram.get_client_first().encode("utf-8")

    def step(self, server_bytes: bytes) -> bytes | None:
        """The next token for the broker's reply, or None once authenticated."""
        if self._state in ("start", "done", "failed"):
            raise RuntimeError("step() outside an exchange: call first(), and not after done or a failure")
        if self._scram is None:  # PLAIN: the broker's (empty) reply ends it
            self._state = "done"
            return None
        try:
            return self._scram_step(self._scram, server_bytes)
        except Exception:
            self._state = "failed"
            raise

    def _scram_step(self, scram: ScramClient, server_bytes: bytes) -> bytes | None:
        try:
            text = server_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslClientError(f"{self.mechanism}: the broker's reply is not UTF-8") from None
        if self._state == "first_sent":
            try:
                scram.set_server_first(text)
            except ScramException as e:  # scramp's messages name the problem, never the password
                raise SaslClientError(f"{self.mechanism}: invalid server-first message: {e}") from None
            iterations = int(scram.iterations)
            if iterations > self._max_iterations:
                raise SaslClientError(f"{self.mechanism}: the broker asks for {iterations} iterations, "
                                      f"more than the {self._max_iterations} allowed")
            self._state = "final_sent"
            return scram.get_client_final().encode("utf-8")
        try:
            scram.set_server_final(text)  # checks the server signature
        except ScramException as e:
            raise SaslClientError(f"{self.mechanism}: the broker's final message failed: {e}") from None
        self._state = "done"
        return None


def _saslprep_stable(text: str) -> bool:
    try:
        return saslprep(text) == text
    except ScramException:
        return False
