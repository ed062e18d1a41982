"""The server side of SASL for the proxy's terminating mode: client tokens in, server tokens
and, at the end, the authenticated principal out. Pure; the connection code carries the tokens
in SaslAuthenticate requests and responses.

PLAIN takes one step and follows Kafka's PlainSaslServer: three NUL-separated tokens, an empty
authorization id or one equal to the user name, and the same error messages. SCRAM-SHA-256 and
SCRAM-SHA-512 take two steps (server-first, then server-final) and run on scramp's ScramServer.

Unlike Kafka, an unknown SCRAM user is not refused at the first message: the server answers
with a salt derived from the name and fails at the proof, exactly as for a wrong password (RFC
5802 section 5.1 suggests this), so the exchange does not reveal which user names exist.

Every failure raises SaslAuthenticationError; its message is safe to send to the client and to
log, and never contains the password. Its `reason` tells the operator what actually happened.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from kafka_quota_proxy.identity.credentials import (
    MECHANISMS,
    PLAIN,
    SCRAM_ITERATIONS,
    SCRAM_KEY_LENGTHS,
    CredentialStore,
)

SUPPORTED_MECHANISMS: tuple[str, ...] = MECHANISMS

# Kafka's wording. SCRAM failures all get SaslServerAuthenticator's generic text.
PLAIN_FAILED = "Authentication failed: Invalid username or password"
AUTHZID_MISMATCH = ("Authentication failed: "
                    "Client requested an authorization id that is different from username")
_SCRAM_FAILED = ("Authentication failed during authentication "
                 "due to invalid credentials with SASL mechanism {}")

# Keys the fake salts of unknown SCRAM users: stable per name for the life of the process, so a
# repeated attempt sees the same salt, as it would for a real user.
_UNKNOWN_USER_SECRET = secrets.token_bytes(32)


class SaslAuthenticationError(Exception):
    """A SASL exchange failed. `str(e)` is for the client; `reason` is for logs and metrics:
    malformed, bad_credentials, unknown_user, authzid_mismatch, unsupported_token_auth,
    unsupported_mechanism, illegal_state."""

    kind = "sasl_authentication_failed"

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class UnsupportedSaslMechanism(SaslAuthenticationError):
    """The client asked for a mechanism the proxy does not offer (Kafka: UNSUPPORTED_SASL_MECHANISM)."""

    kind = "unsupported_sasl_mechanism"


class IllegalSaslState(SaslAuthenticationError):
    """A token arrived after the exchange had finished or failed (Kafka: ILLEGAL_SASL_STATE)."""

    kind = "illegal_sasl_state"


@dataclass(frozen=True, slots=True)
class SaslStep:
    """What to send back, and once `done`, who the client is (`principal`, the user name)."""

    server_bytes: bytes
    done: bool
    principal: str | None


class SaslServer:
    """One SASL exchange on one connection. Build a new one for every (re-)authentication."""

    __slots__ = ("mechanism", "_store", "_state", "_scram", "_user", "_user_known")

    def __init__(self, mechanism: str, store: CredentialStore) -> None:
        if mechanism not in SUPPORTED_MECHANISMS:
            raise UnsupportedSaslMechanism(f"Unsupported SASL mechanism {mechanism[:64]}",
                                           "unsupported_mechanism")
        self.mechanism = mechanism
        self._store = store
        self._state = "start"  # start -> (scram_first ->) done, or failed from anywhere
        self._scram = None if mechanism == PLAIN else ScramMechanism(mechanism).make_server(self._auth_info)
        self._user: str | None = None
        self._user_known = False

    @property
    def done(self) -> bool:
        return self._state == "done"

    def step(self, client_bytes: bytes) -> SaslStep:
        """Take the client's next token; raise SaslAuthenticationError if the login fails.

        PLAIN hashes the password (see CredentialStore.verify_plain): call it off the event loop.
        """
        if self._state in ("done", "failed"):
            raise IllegalSaslState("Authentication failed: the SASL exchange is already over",
                                   "illegal_state")
        try:
            if self.mechanism == PLAIN:
                return self._plain(client_bytes)
            if self._state == "start":
                return self._scram_first(client_bytes)
            return self._scram_final(client_bytes)
        except Exception:
            self._state = "failed"
            raise

    # ---- PLAIN ----

    def _plain(self, client_bytes: bytes) -> SaslStep:
        try:
            text = client_bytes.decode("utf-8")
        except UnicodeDecodeError:
            # Java would decode with replacement characters and then fail the password check.
            raise SaslAuthenticationError(PLAIN_FAILED, "malformed") from None
        tokens = text.split("\x00", 3)  # like PlainSaslServer.extractTokens: at most four
        if len(tokens) != 3:
            raise SaslAuthenticationError(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(tokens)}", "malformed")
        authzid, user, password = tokens
        if not user:
            raise SaslAuthenticationError("Authentication failed: username not specified", "malformed")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified", "malformed")
        if not self._store.verify_plain(user, password):
            reason = "bad_credentials" if PLAIN in self._store.mechanisms(user) else "unknown_user"
            raise SaslAuthenticationError(PLAIN_FAILED, reason)
        # Checked after the password, as Kafka does, so it reveals nothing to a wrong password.
        if authzid and authzid != user:
            raise SaslAuthenticationError(AUTHZID_MISMATCH, "authzid_mismatch")
        self._state = "done"
        return SaslStep(b"", True, user)

    # ---- SCRAM ----

    def _scram_first(self, client_bytes: bytes) -> SaslStep:
        text = self._scram_text(client_bytes)
        # scramp hands auth_fn the SASLprep'ed name; Kafka looks the raw name up, and so do we.
        self._user = _scram_user_name(text)
        if self._user is None:
            raise self._failure("malformed")
        if _wants_delegation_token(text):
            # Kafka's tokenauth=true: the name is a delegation token id, which this store lacks.
            raise self._failure("unsupported_token_auth")
        assert self._scram is not None
        try:
            self._scram.set_client_first(text)
            server_first = self._scram.get_server_first()
        except ScramException:
            raise self._failure("malformed") from None
        self._state = "scram_first"
        return SaslStep(server_first.encode("utf-8"), False, None)

    def _scram_final(self, client_bytes: bytes) -> SaslStep:
        text = self._scram_text(client_bytes)
        assert self._scram is not None
        try:
            self._scram.set_client_final(text)
            server_final = self._scram.get_server_final()
        except ScramException:
            raise self._failure("bad_credentials" if self._user_known else "unknown_user") from None
        if not self._user_known:  # unreachable with random fake keys; belt and braces
            raise self._failure("unknown_user")
        self._state = "done"
        return SaslStep(server_final.encode("utf-8"), True, self._user)

    def _auth_info(self, _saslprepped_name: str) -> tuple[bytes, bytes, bytes, int]:
        assert self._user is not None
        info = self._store.scram_auth_info(self._user, self.mechanism)
        if info is not None:
            self._user_known = True
            return info
        return _unknown_user_auth_info(self.mechanism, self._user)

    def _scram_text(self, client_bytes: bytes) -> str:
        try:
            return client_bytes.decode("utf-8")
        except UnicodeDecodeError:
            raise self._failure("malformed") from None

    def _failure(self, reason: str) -> SaslAuthenticationError:
        return SaslAuthenticationError(_SCRAM_FAILED.format(self.mechanism), reason)


def _scram_user_name(client_first: str) -> str | None:
    """The user name in a client-first message, "<gs2 flag>,<authzid>,n=<saslname>,r=...";
    None if the message has no well-formed name (scramp then refuses the rest)."""
    parts = client_first.split(",", 3)
    if len(parts) < 4 or not parts[2].startswith("n="):
        return None
    escaped = parts[2][2:]
    # RFC 5802: "=" appears only in the escapes =2C (",") and =3D ("=").
    if not escaped or escaped.count("=") != escaped.count("=2C") + escaped.count("=3D"):
        return None
    return escaped.replace("=2C", ",").replace("=3D", "=")


def _wants_delegation_token(client_first: str) -> bool:
    extensions = client_first.split(",")[4:]  # after gs2 flag, authzid, n= and r=
    return any(e.lower() == "tokenauth=true" for e in extensions)


def _unknown_user_auth_info(mechanism: str, user: str) -> tuple[bytes, bytes, bytes, int]:
    """Credentials no password matches, shaped like a real user's, for a name the store lacks."""
    salt = hmac.new(_UNKNOWN_USER_SECRET, f"{mechanism}\x00{user}".encode("utf-8", "surrogatepass"),
                    hashlib.sha256).digest()  # 32 bytes, the length scramp gives real salts
    key_length = SCRAM_KEY_LENGTHS[mechanism]
    return salt, secrets.token_bytes(key_length), secrets.token_bytes(key_length), SCRAM_ITERATIONS[mechanism]
