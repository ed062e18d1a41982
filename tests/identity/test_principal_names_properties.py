"""Properties of what turns a client's certificate or claimed SASL name into a principal: the
DER subject reader agrees with the getpeercert() one on any subject; a client's bytes and names,
whatever they are, fail only with the errors these modules document (ValueError for a
certificate, NoMatchingRule / MalformedKerberosName for a name)."""

from __future__ import annotations

import datetime
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from hypothesis import example, given
from hypothesis import strategies as st

from kafka_quota_proxy.identity import kerberos_rules, ssl_rules
from kafka_quota_proxy.identity.kerberos_rules import KerberosShortNamer, MalformedKerberosName
from kafka_quota_proxy.identity.ssl_rules import SslPrincipalMapper
from kafka_quota_proxy.identity.x500 import x500_name, x500_name_from_der
from tests.support.mutations import mutated

KEY = ed25519.Ed25519PrivateKey.generate()  # deterministic signatures: the same subject, the same bytes
# getpeercert()'s name for each attribute type, and the type as cryptography builds it (with the
# ASN.1 string type x500_name guesses for it: UTF8String, PrintableString for C, IA5 for email).
ATTRIBUTES = {
    "commonName": NameOID.COMMON_NAME, "organizationName": NameOID.ORGANIZATION_NAME,
    "organizationalUnitName": NameOID.ORGANIZATIONAL_UNIT_NAME, "localityName": NameOID.LOCALITY_NAME,
    "stateOrProvinceName": NameOID.STATE_OR_PROVINCE_NAME, "emailAddress": NameOID.EMAIL_ADDRESS,
    "countryName": NameOID.COUNTRY_NAME, "domainComponent": NameOID.DOMAIN_COMPONENT,
    "title": NameOID.TITLE, "userId": NameOID.USER_ID,
}
PRINTABLE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 '()+,-./:=?"
# Values with everything RFC 2253 escapes: , = + < > # ; " \ NUL, and leading/trailing spaces.
utf8_values = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12)
ascii_values = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), min_size=1, max_size=12)


@st.composite
def subjects(draw: st.DrawFn) -> list[list[tuple[str, str]]]:
    rdns = []
    for _ in range(draw(st.integers(1, 4))):
        rdn = []
        types = st.lists(st.sampled_from(sorted(ATTRIBUTES)), min_size=1, max_size=2, unique=True)
        for attribute in draw(types):
            if attribute == "countryName":
                value = draw(st.text(st.sampled_from(PRINTABLE), min_size=2, max_size=2))
            elif attribute in ("emailAddress", "domainComponent"):
                value = draw(ascii_values)
            else:
                value = draw(utf8_values)
            rdn.append((attribute, value))
        rdns.append(rdn)
    return rdns


def certificate(subject: list[list[tuple[str, str]]]) -> bytes:
    name = x509.Name([x509.RelativeDistinguishedName([x509.NameAttribute(ATTRIBUTES[a], v) for a, v in rdn])
                      for rdn in subject])
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(KEY.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(KEY, None))
    return cert.public_bytes(Encoding.DER)


def getpeercert_subject(der: bytes) -> object:
    """The subject as ssl.SSLSocket.getpeercert() gives it: CPython's own decoder, run on a file."""
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(ssl.DER_cert_to_PEM_cert(der))
        f.flush()
        return ssl._ssl._test_decode_cert(f.name)["subject"]  # type: ignore[attr-defined]


@given(subjects())
def test_der_and_getpeercert_readers_agree(subject: list[list[tuple[str, str]]]) -> None:
    der = certificate(subject)
    assert x500_name_from_der(der) == x500_name(getpeercert_subject(der))  # type: ignore[arg-type]


@given(st.binary(max_size=120) | subjects().map(certificate).flatmap(mutated))
@example(b"\x30\x84\xff\xff\xff\xff")  # a length far past the end
@example(b"\x30\x80")  # indefinite length (BER, not DER)
def test_any_certificate_bytes_fail_only_with_value_error(der: bytes) -> None:
    try:
        x500_name_from_der(der)
    except ValueError:
        pass


# --- principal mapping rules on names a client chose --------------------------------------------

KERBEROS = KerberosShortNamer.parse([r"RULE:[1:$1@$0](.*@EXAMPLE\.COM)s/@.*//",
                                     r"RULE:[2:$1;$2](App\..*)s/App\.(.*)/$1/g/L", "DEFAULT"], "EXAMPLE.COM")
SSL = SslPrincipalMapper.from_rules(r"RULE:^CN=(.*?),OU=(.*?)$/$1@$2/L, RULE:^.*[Cc][Nn]=([a-z]*).*$/$1/U")
any_name = st.text(max_size=40) | st.text(st.sampled_from("ab/@.$\\App"), max_size=20)


@given(any_name)
@example("a@b@c")
@example("App.x/host@EXAMPLE.COM")
def test_kerberos_short_names_fail_only_as_documented(name: str) -> None:
    try:
        KERBEROS.short_name(name)
    except (kerberos_rules.NoMatchingRule, MalformedKerberosName):
        pass


@given(any_name | subjects().map(x500_name))
def test_ssl_mapping_fails_only_as_documented(dn: str) -> None:
    try:
        SSL.get_name(dn)
    except ssl_rules.NoMatchingRule:
        pass
