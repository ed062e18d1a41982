"""The user name a client claims in its own SASL bytes, for PLAIN, SCRAM and OAUTHBEARER.

In passthrough mode the proxy forwards SaslAuthenticate untouched and the broker decides who
the client is; the proxy only reads the name the client claims, so it can charge the right
quota entity from the first request. Nothing here checks a password, a SCRAM proof or a token
signature, and no error message repeats a password or a token.

Where RFC 4616 / 5802 / 7628 and Kafka's own parser disagree we accept what the RFC allows and
reject what Kafka rejects for certain (an authorization id naming someone else, channel
binding); a token Kafka's stricter grammar refuses is then refused by the broker anyway.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "OAuthBearerInitialResponse",
    "SaslBytes",
    "SaslTokenError",
    "ScramClientFirst",
    "oauthbearer_claim",
    "parse_oauthbearer_initial_response",
    "parse_scram_client_first",
    "plain_authcid",
    "scram_is_client_first",
    "scram_username",
]


# What a SaslAuthenticate request's auth_bytes may arrive as: a slice of the frame buffer, or a copy.
SaslBytes = bytes | bytearray | memoryview


class SaslTokenError(ValueError):
    """SASL bytes that are malformed, or that Kafka's SASL server would refuse before any check."""


def _utf8(token: SaslBytes, mechanism: str) -> str:
    try:
        return bytes(token).decode("utf-8")
    except UnicodeDecodeError:
        raise SaslTokenError(f"{mechanism} message is not UTF-8") from None


# --- PLAIN (RFC 4616) ------------------------------------------------------------------------


def plain_authcid(token: SaslBytes) -> str:
    """The authentication identity (user name) of a PLAIN message `[authzid] NUL authcid NUL passwd`.

    Refused as Kafka's PlainSaslServer refuses them: not exactly two NULs, an empty user name
    or password, an authorization id other than the user name. Kafka decodes invalid UTF-8
    with replacement characters; we refuse it, as the name would not be the one typed.
    """
    text = _utf8(token, "SASL/PLAIN")
    parts = text.split("\0")
    if len(parts) != 3:
        raise SaslTokenError(f"Invalid SASL/PLAIN response: expected 3 tokens, got {min(len(parts), 4)}")
    authzid, authcid, password = parts
    if not authcid:
        raise SaslTokenError("SASL/PLAIN: username not specified")
    if not password:
        raise SaslTokenError("SASL/PLAIN: password not specified")
    if authzid and authzid != authcid:
        raise SaslTokenError(
            "SASL/PLAIN: client requested an authorization id that is different from username")
    return authcid


# --- GS2 header and saslname (RFC 5801, 5802) ------------------------------------------------


def _saslname(encoded: str, what: str) -> str:
    """Decode a saslname: `=2C` is ',' and `=3D` is '='; any other '=' is an error."""
    if not encoded:
        raise SaslTokenError(f"{what} is empty")
    if "\0" in encoded:
        raise SaslTokenError(f"{what} contains NUL")
    out: list[str] = []
    i = 0
    while i < len(encoded):
        c = encoded[i]
        if c == "=":
            escape = encoded[i + 1 : i + 3]
            if escape == "2C":
                out.append(",")
            elif escape == "3D":
                out.append("=")
            else:
                raise SaslTokenError(f"{what} has an '=' that is neither =2C nor =3D")
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _gs2_header(flag: str, authzid_field: str, mechanism: str) -> tuple[str, str]:
    """Check a GS2 header's channel binding flag and authzid; return (flag, decoded authzid)."""
    if flag.startswith("p="):
        raise SaslTokenError(f"{mechanism}: channel binding (p=) is not supported by Kafka")
    if flag not in ("n", "y"):
        raise SaslTokenError(f"{mechanism}: bad GS2 channel binding flag")
    if not authzid_field:
        return flag, ""
    if not authzid_field.startswith("a="):
        raise SaslTokenError(f"{mechanism}: bad GS2 authzid (expected a=)")
    return flag, _saslname(authzid_field[2:], f"{mechanism} authzid")


# --- SCRAM (RFC 5802) ------------------------------------------------------------------------

_EXTENSION_KEY = re.compile(r"[A-Za-z]+")
_PRINTABLE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")


@dataclass(frozen=True, slots=True)
class ScramClientFirst:
    """A SCRAM client-first-message: `gs2-header [m=...,]n=user,r=nonce[,ext=value...]`."""

    gs2_cbind_flag: str
    authzid: str
    username: str
    nonce: str
    extensions: Mapping[str, str] = field(default_factory=dict)

    @property
    def delegation_token(self) -> bool:
        """Kafka's `tokenauth=true` extension: `username` is then a delegation token id, and
        the broker's principal is the token's owner, which the proxy must learn
        (identity/delegation_tokens.py)."""
        return self.extensions.get("tokenauth", "").lower() == "true"


def scram_is_client_first(token: SaslBytes) -> bool:
    """Whether SCRAM bytes start like a client-first-message (a GS2 header), not a client-final
    one (which starts `c=`)."""
    return bytes(token[:2]) in (b"n,", b"y,", b"p=")


def parse_scram_client_first(token: SaslBytes) -> ScramClientFirst:
    """Parse a SCRAM-SHA-256/512 client-first-message, in RFC 5802's attribute order.

    Refused: channel binding `p=` (Kafka supports none), an authzid other than the user name
    (Kafka's ScramSaslServer refuses it), a missing or bad `n=` or `r=`, a bad extension.
    Accepted as RFC 5802 allows though Kafka's parser does not: the `y` flag, and non-ASCII
    names. Kafka compares an `a=` authzid before decoding its escapes; we compare decoded names.
    """
    text = _utf8(token, "SCRAM")
    if "\0" in text:
        raise SaslTokenError("SCRAM client-first-message contains NUL")
    fields = text.split(",")
    if len(fields) < 4:
        raise SaslTokenError("Invalid SCRAM client first message: too few attributes")
    flag, authzid = _gs2_header(fields[0], fields[1], "SCRAM")
    bare = fields[2:]
    if bare[0].startswith("m="):
        # reserved-mext: Kafka's parser accepts and ignores it, so we do too.
        if len(bare[0]) == 2:
            raise SaslTokenError("SCRAM: empty m= attribute")
        bare = bare[1:]
    if len(bare) < 2 or not bare[0].startswith("n="):
        raise SaslTokenError("Invalid SCRAM client first message: n= (username) missing")
    username = _saslname(bare[0][2:], "SCRAM username")
    if not bare[1].startswith("r=") or not _PRINTABLE.fullmatch(bare[1], 2):
        raise SaslTokenError("Invalid SCRAM client first message: r= (nonce) missing or not printable")
    extensions: dict[str, str] = {}
    for attr in bare[2:]:
        key, eq, value = attr.partition("=")
        if not eq or not _EXTENSION_KEY.fullmatch(key) or not value:
            raise SaslTokenError("Invalid SCRAM client first message: bad extension")
        extensions[key] = value
    if authzid and authzid != username:
        raise SaslTokenError("SCRAM: client requested an authorization id that is different from username")
    return ScramClientFirst(flag, authzid, username, bare[1][2:], extensions)


def scram_username(client_first: SaslBytes) -> str:
    """The user name in a SCRAM client-first-message, its `=2C` and `=3D` escapes decoded.

    With Kafka's `tokenauth=true` extension this is a delegation token id rather than a user:
    use `parse_scram_client_first(...).delegation_token` to tell.
    """
    return parse_scram_client_first(client_first).username


# --- OAUTHBEARER (RFC 7628) ------------------------------------------------------------------

_KVSEP = "\x01"
_KV_VALUE = re.compile(r"[\x21-\x7e \t\r\n]+")
# RFC 6750's b64token after a case-insensitive "Bearer" and at least one space, as Kafka reads it.
_AUTH = re.compile(r"(\w+) +([-_~+/.a-zA-Z0-9]+=*)", re.ASCII)
_B64 = re.compile(r"[A-Za-z0-9_\-+/]*=*", re.ASCII)


@dataclass(frozen=True, slots=True)
class OAuthBearerInitialResponse:
    """An OAUTHBEARER client initial response: `gs2-header ^A auth=Bearer <token> ^A [k=v ^A]... ^A`."""

    gs2_cbind_flag: str
    authzid: str
    token: str = field(repr=False)  # a bearer credential: never printed
    extensions: Mapping[str, str] = field(default_factory=dict)


def parse_oauthbearer_initial_response(message: SaslBytes) -> OAuthBearerInitialResponse:
    """Parse an OAUTHBEARER client initial response (the token is not decoded here).

    Refused: the lone ^A a client sends to acknowledge a server error, channel binding `p=`,
    a missing `auth`, a scheme other than Bearer, a badly formed key or value.
    """
    text = _utf8(message, "OAUTHBEARER")
    if text == _KVSEP:
        raise SaslTokenError("OAUTHBEARER: client acknowledged a server error; the message carries no token")
    header, sep, rest = text.partition(_KVSEP)
    gs2 = header.split(",")
    if not sep or len(gs2) != 3 or gs2[2] != "":
        raise SaslTokenError("Invalid OAUTHBEARER client first message: bad GS2 header")
    flag, authzid = _gs2_header(gs2[0], gs2[1], "OAUTHBEARER")
    if not rest.endswith(_KVSEP):
        raise SaslTokenError("Invalid OAUTHBEARER client first message: not terminated by ^A^A")
    pairs = rest[:-1].split(_KVSEP)
    if pairs[-1] != "":
        raise SaslTokenError("Invalid OAUTHBEARER client first message: unterminated key/value pair")
    kv: dict[str, str] = {}
    for pair in pairs[:-1]:
        key, eq, value = pair.partition("=")
        if not eq or not _EXTENSION_KEY.fullmatch(key) or not _KV_VALUE.fullmatch(value):
            raise SaslTokenError("Invalid OAUTHBEARER client first message: bad key/value pair")
        kv[key] = value
    auth = kv.pop("auth", None)
    if auth is None:
        raise SaslTokenError("Invalid OAUTHBEARER client first message: 'auth' not specified")
    m = _AUTH.fullmatch(auth)
    if m is None:
        raise SaslTokenError("Invalid OAUTHBEARER client first message: invalid 'auth' format")
    if m.group(1).lower() != "bearer":
        raise SaslTokenError("Invalid scheme in OAUTHBEARER client first message (expected Bearer)")
    return OAuthBearerInitialResponse(flag, authzid, m.group(2), kv)


def oauthbearer_claim(message: SaslBytes, claim: str = "sub") -> str:
    """The principal claim of the JWT in an OAUTHBEARER client initial response.

    The token must be a compact JWS (three base64url parts); its payload is read, its signature
    is not checked and neither are its times: the broker validates the token. Kafka's unsecured
    tokens (`"alg":"none"`, empty signature) are read the same way. As in Kafka the claim must
    be a non-blank string; a signed token's claim is trimmed (Kafka's validator for signed
    tokens trims it, the unsecured one does not). An authzid must equal the claim (Kafka refuses
    the authentication otherwise).
    """
    if not claim.strip():
        raise ValueError("the principal claim name must not be blank")
    response = parse_oauthbearer_initial_response(message)
    parts = response.token.split(".")
    if len(parts) == 5:
        raise SaslTokenError("OAUTHBEARER: the token is an encrypted JWT (JWE); only a JWS can be read")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise SaslTokenError("OAUTHBEARER: the token is not a JWS (header.payload.signature)")
    header = _json_object(parts[0], "header")
    alg = header.get("alg")
    if not isinstance(alg, str):
        raise SaslTokenError("OAUTHBEARER: the token's header has no 'alg'")
    unsecured = alg == "none"
    if unsecured and parts[2]:
        raise SaslTokenError("OAUTHBEARER: an unsecured token (alg none) must not carry a signature")
    if not unsecured and not parts[2]:
        raise SaslTokenError(f"OAUTHBEARER: a token signed with {alg} has no signature")
    value = _json_object(parts[1], "payload").get(claim)
    if not isinstance(value, str) or not value.strip():
        raise SaslTokenError(f"OAUTHBEARER: no principal name in JWT claim: {claim}")
    principal = value if unsecured else value.strip()
    if response.authzid and response.authzid != principal:
        raise SaslTokenError("OAUTHBEARER: client requested an authorization id that is different "
                             "from the token's principal name")
    return principal


def _json_object(part: str, what: str) -> dict[str, object]:
    """Base64url-decode one JWS part and parse it as a JSON object."""
    # JWS uses base64url without padding; Kafka's unsecured-token parser reads the standard
    # alphabet, so both are accepted, padded or not.
    if not _B64.fullmatch(part):
        raise SaslTokenError(f"OAUTHBEARER: the token's {what} is not base64url")
    body = part.rstrip("=").replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        raise SaslTokenError(f"OAUTHBEARER: the token's {what} is not base64url JSON") from None
    except RecursionError:  # JSON nested deeper than the interpreter's stack: "[[[[..."
        raise SaslTokenError(f"OAUTHBEARER: the token's {what} is nested too deeply") from None
    if not isinstance(value, dict):
        raise SaslTokenError(f"OAUTHBEARER: the token's {what} is not a JSON object")
    return value
