"""The terminating proxy's user store: salted credentials per user, never a clear password.

What is stored per mechanism and why: docs/identity.md, "The credentials store". The file it is
kept in is read and written by config/credentials_file.py.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from scramp import ScramException, ScramMechanism
from scramp.utils import saslprep

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
SCRAM_MECHANISMS = (SCRAM_SHA_256, SCRAM_SHA_512)
MECHANISMS = (SCRAM_SHA_256, SCRAM_SHA_512, PLAIN)  # also the order they are listed and stored in

SCRAM_ITERATIONS = {SCRAM_SHA_256: 8192, SCRAM_SHA_512: 8192}
SCRAM_MIN_ITERATIONS = 4096  # Kafka's ScramMechanism.minIterations
SCRAM_MAX_ITERATIONS = 16384  # Kafka's ScramMechanism.maxIterations
SCRAM_KEY_LENGTHS = {SCRAM_SHA_256: 32, SCRAM_SHA_512: 64}  # digest sizes
SCRAM_MIN_SALT = 12  # scramp refuses shorter salts at login, so refuse them at load

PLAIN_ALGORITHM = "PBKDF2-HMAC-SHA512"
PLAIN_ITERATIONS = 210_000
PLAIN_MIN_ITERATIONS = 100_000
PLAIN_MAX_ITERATIONS = 10_000_000  # a hand-edited typo should not stall every PLAIN login
PLAIN_SALT_LENGTH = 16
PLAIN_HASH_LENGTH = 64


class CredentialError(ValueError):
    """A user, password or mechanism list that `add` refuses. `key` says which of the three.

    The message never contains the password.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """RFC 5802's per-user server data for one SCRAM mechanism."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


@dataclass(frozen=True, slots=True)
class PlainVerifier:
    """PBKDF2-HMAC-SHA512 of the password, for checking SASL/PLAIN logins."""

    salt: bytes
    iterations: int
    hash: bytes

    def matches(self, password: bytes) -> bool:
        derived = hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations)
        return hmac.compare_digest(derived, self.hash)


@dataclass(frozen=True, slots=True)
class UserCredentials:
    """Everything stored for one user; a mechanism without an entry is not enabled for them."""

    scram: Mapping[str, ScramCredential]
    plain: PlainVerifier | None

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return tuple(m for m in MECHANISMS if (m == PLAIN and self.plain) or m in self.scram)


# Checked for users the store does not have, so that an unknown name costs as much as a wrong
# password and response times do not tell which names exist. Random, so nothing matches it.
_DUMMY_SALT = secrets.token_bytes(PLAIN_SALT_LENGTH)
_DUMMY_HASH = secrets.token_bytes(PLAIN_HASH_LENGTH)


class CredentialStore:
    """Users and their salted credentials (config/credentials_file.py reads and writes the file)."""

    __slots__ = ("_users", "_dummy_plain")

    def __init__(self, users: Mapping[str, UserCredentials] | None = None) -> None:
        self._users: dict[str, UserCredentials] = dict(users or {})
        self._dummy_plain: PlainVerifier | None = None  # built on first need, reset by changes

    # ---- queries ----

    def users(self) -> tuple[str, ...]:
        """User names, sorted."""
        return tuple(sorted(self._users))

    def entries(self) -> Mapping[str, UserCredentials]:
        """Every user's credentials, read-only (what the credentials file holds)."""
        return MappingProxyType(self._users)

    def mechanisms(self, user: str) -> tuple[str, ...]:
        """The mechanisms `user` can log in with; empty for an unknown user."""
        entry = self._users.get(user)
        return entry.mechanisms if entry is not None else ()

    def __contains__(self, user: object) -> bool:
        return user in self._users

    def __len__(self) -> int:
        return len(self._users)

    def verify_plain(self, user: str, password: str) -> bool:
        """True if `password` is `user`'s PLAIN password.

        An unknown user, or one without PLAIN, costs the same PBKDF2 run as a known one, and the
        digests are compared with hmac.compare_digest, so timing does not reveal which it was.
        CPU-heavy (see the module docstring): call it from a worker thread.
        """
        entry = self._users.get(user)
        verifier = entry.plain if entry is not None else None
        known = verifier is not None
        try:
            secret = password.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: no stored password can match
            secret, known = b"", False
        matched = (verifier or self._dummy()).matches(secret)
        return matched and known

    def _dummy(self) -> PlainVerifier:
        """The stand-in verifier, at the iteration count most of this store's users have, so an
        unknown name takes as long as a known one even in a file made with a custom count."""
        if self._dummy_plain is None:
            counts = Counter(e.plain.iterations for e in self._users.values() if e.plain is not None)
            iterations = counts.most_common(1)[0][0] if counts else PLAIN_ITERATIONS
            self._dummy_plain = PlainVerifier(_DUMMY_SALT, iterations, _DUMMY_HASH)
        return self._dummy_plain

    def scram_auth_info(self, user: str, mechanism: str) -> tuple[bytes, bytes, bytes, int] | None:
        """(salt, stored_key, server_key, iterations) for scramp's auth_fn; None if not enabled."""
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"{mechanism!r} is not a SCRAM mechanism")
        entry = self._users.get(user)
        credential = entry.scram.get(mechanism) if entry is not None else None
        if credential is None:
            return None
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    # ---- changes ----

    def add(self, user: str, password: str, mechanisms: Iterable[str] = MECHANISMS, *,
            scram_iterations: int | None = None, plain_iterations: int = PLAIN_ITERATIONS) -> bool:
        """Set `user`'s credentials for exactly `mechanisms`, replacing any they had.

        Returns True if the user is new. Raises CredentialError for a bad name, password or
        mechanism list. `scram_iterations` overrides SCRAM_ITERATIONS for both SCRAM mechanisms.
        """
        chosen = normalise_mechanisms(mechanisms)
        scram = [m for m in chosen if m in SCRAM_MECHANISMS]
        check_user_name(user, uses_scram=bool(scram))
        _check_password(password, uses_scram=bool(scram))
        scram_range = range(SCRAM_MIN_ITERATIONS, SCRAM_MAX_ITERATIONS + 1)
        if scram_iterations is not None and scram_iterations not in scram_range:
            raise CredentialError("iterations", f"SCRAM iterations must be between {SCRAM_MIN_ITERATIONS} "
                                                f"and {SCRAM_MAX_ITERATIONS}")
        if not PLAIN_MIN_ITERATIONS <= plain_iterations <= PLAIN_MAX_ITERATIONS:
            raise CredentialError("iterations", f"PLAIN iterations must be between {PLAIN_MIN_ITERATIONS} "
                                                f"and {PLAIN_MAX_ITERATIONS}")
        scram_credentials: dict[str, ScramCredential] = {}
        for mechanism in scram:
            iterations = scram_iterations or SCRAM_ITERATIONS[mechanism]
            try:
                salt, stored_key, server_key, count = ScramMechanism(mechanism).make_auth_info(
                    password, iteration_count=iterations)
            except ScramException:  # the password was checked above; do not echo scramp's reason
                raise CredentialError("password", "the password cannot be used for SCRAM") from None
            scram_credentials[mechanism] = ScramCredential(salt, stored_key, server_key, count)
        plain = None
        if PLAIN in chosen:
            salt = secrets.token_bytes(PLAIN_SALT_LENGTH)
            digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, plain_iterations)
            plain = PlainVerifier(salt, plain_iterations, digest)
        is_new = user not in self._users
        self._users[user] = UserCredentials(scram_credentials, plain)
        self._dummy_plain = None
        return is_new

    def remove(self, user: str) -> None:
        """Forget `user`; KeyError if there is no such user."""
        del self._users[user]
        self._dummy_plain = None


def normalise_mechanisms(mechanisms: Iterable[str]) -> tuple[str, ...]:
    """Upper-case, de-duplicate and order a mechanism list; CredentialError for unknown ones."""
    if isinstance(mechanisms, str):  # "PLAIN" would otherwise be read as five one-letter names
        mechanisms = [mechanisms]
    wanted = set()
    for mechanism in mechanisms:
        name = mechanism.strip().upper()
        if name not in MECHANISMS:
            raise CredentialError("mechanisms", f"unknown SASL mechanism {mechanism!r}; "
                                                f"supported: {', '.join(MECHANISMS)}")
        wanted.add(name)
    if not wanted:
        raise CredentialError("mechanisms", "at least one SASL mechanism is needed")
    return tuple(m for m in MECHANISMS if m in wanted)


def check_user_name(user: object, *, uses_scram: bool) -> None:
    """Raise CredentialError if `user` cannot be a user name; shared by `add` and the file reader."""
    if not isinstance(user, str) or not user:
        problem = "the user name must be a non-empty string"
    elif "\x00" in user:
        problem = "the user name must not contain NUL, which separates the fields of a PLAIN login"
    elif not _encodable(user):
        problem = "the user name must be valid Unicode (it has a lone surrogate)"
    elif uses_scram and not _saslprep_ok(user):
        # scramp applies SASLprep to the name a client sends and refuses what it prohibits.
        problem = "the user name has characters SASLprep prohibits (e.g. control characters), so " \
                  "it cannot log in with SCRAM; use PLAIN only"
    else:
        return None
    raise CredentialError("user", problem)


def _check_password(password: object, *, uses_scram: bool) -> None:
    if not isinstance(password, str) or not password:
        raise CredentialError("password", "the password must not be empty")
    if not _encodable(password):
        raise CredentialError("password", "the password must be valid Unicode")
    if uses_scram:
        try:
            stable = saslprep(password) == password
        except ScramException:
            stable = False
        if not stable:
            raise CredentialError(
                "password", "the password changes under SASLprep (non-ASCII spaces, compatibility or "
                            "decomposed characters, control characters); Kafka clients hash it "
                            "unnormalised, so SCRAM logins would fail. Choose another password or "
                            "enable PLAIN only")


def _saslprep_ok(text: str) -> bool:
    try:
        saslprep(text)
    except ScramException:
        return False
    return True


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
