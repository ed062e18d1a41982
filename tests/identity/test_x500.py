"""identity.x500: the certificate subject as Java's X500Principal.getName() prints it.

The expected DNs are what OpenJDK 17's `X509Certificate.getSubjectX500Principal().getName()`
printed for certificates with those subjects.
"""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID

from kafka_quota_proxy.identity.ssl_rules import SslPrincipalMapper
from kafka_quota_proxy.identity.x500 import x500_name, x500_name_from_der

A = x509.NameAttribute
R = x509.RelativeDistinguishedName


def attr(oid: x509.ObjectIdentifier, value: str) -> R:
    return R([A(oid, value)])


# (certificate subject, its getpeercert() form, what OpenJDK 17 printed)
SUBJECTS: dict[str, tuple[list[R], tuple[tuple[tuple[str, str], ...], ...], str]] = {
    "kafka_test_dn": (
        [attr(NameOID.COUNTRY_NAME, "US"), attr(NameOID.STATE_OR_PROVINCE_NAME, "MD"),
         attr(NameOID.LOCALITY_NAME, "Fulton"), attr(NameOID.ORGANIZATION_NAME, "mycp"),
         attr(NameOID.ORGANIZATIONAL_UNIT_NAME, "SME"), attr(NameOID.COMMON_NAME, "Duke")],
        ((("countryName", "US"),), (("stateOrProvinceName", "MD"),), (("localityName", "Fulton"),),
         (("organizationName", "mycp"),), (("organizationalUnitName", "SME"),), (("commonName", "Duke"),)),
        "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US",
    ),
    "escapes": (
        [attr(NameOID.ORGANIZATION_NAME, 'a,b+c"d\\e<f>g;h=i#j'),
         attr(NameOID.COMMON_NAME, "#lead and trail ")],
        ((("organizationName", 'a,b+c"d\\e<f>g;h=i#j'),), (("commonName", "#lead and trail "),)),
        'CN=\\#lead and trail\\ ,O=a\\,b\\+c\\"d\\\\e\\<f\\>g\\;h\\=i\\#j',
    ),
    "spaces": (
        [attr(NameOID.ORGANIZATION_NAME, "  two leading"), attr(NameOID.COMMON_NAME, " ")],
        ((("organizationName", "  two leading"),), (("commonName", " "),)),
        "CN=\\ ,O=\\ \\ two leading",
    ),
    "carriage_returns": (
        [attr(NameOID.COMMON_NAME, "a\r"), attr(NameOID.ORGANIZATIONAL_UNIT_NAME, "\rb")],
        ((("commonName", "a\r"),), (("organizationalUnitName", "\rb"),)),
        "OU=\\\rb,CN=a\\\r",
    ),
    "email_is_an_oid": (
        [attr(NameOID.ORGANIZATION_NAME, "Org"), attr(NameOID.COMMON_NAME, "alice"),
         attr(NameOID.EMAIL_ADDRESS, "alice@example.com")],
        ((("organizationName", "Org"),), (("commonName", "alice"),),
         (("emailAddress", "alice@example.com"),)),
        "1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d,CN=alice,O=Org",
    ),
    "dc_uid_street": (
        [attr(NameOID.DOMAIN_COMPONENT, "com"), attr(NameOID.DOMAIN_COMPONENT, "example"),
         attr(NameOID.STREET_ADDRESS, "1 Main St"), attr(NameOID.USER_ID, "u123")],
        ((("domainComponent", "com"),), (("domainComponent", "example"),), (("streetAddress", "1 Main St"),),
         (("userId", "u123"),)),
        "UID=u123,STREET=1 Main St,DC=example,DC=com",
    ),
    "multi_valued_rdn": (
        [attr(NameOID.ORGANIZATION_NAME, "Org"),
         R([A(NameOID.COMMON_NAME, "bob"), A(NameOID.USER_ID, "42")])],
        ((("organizationName", "Org"),), (("commonName", "bob"), ("userId", "42"))),
        "CN=bob+UID=42,O=Org",
    ),
    "other_types_are_oids": (
        [attr(NameOID.SERIAL_NUMBER, "1234"), attr(NameOID.TITLE, "Boss"),
         attr(NameOID.GIVEN_NAME, "J\u00f6rg"),
         attr(NameOID.SURNAME, "Smith"), attr(NameOID.COMMON_NAME, "j\u00f6rg \u00fcnicode")],
        ((("serialNumber", "1234"),), (("title", "Boss"),), (("givenName", "J\u00f6rg"),),
         (("surname", "Smith"),),
         (("commonName", "j\u00f6rg \u00fcnicode"),)),
        "CN=j\u00f6rg \u00fcnicode,2.5.4.4=#0c05536d697468,2.5.4.42=#0c054ac3b67267,2.5.4.12=#0c04426f7373,"
        "2.5.4.5=#130431323334",
    ),
    "ev_jurisdiction": (
        [attr(NameOID.JURISDICTION_COUNTRY_NAME, "DE"),
         attr(NameOID.BUSINESS_CATEGORY, "Private Organization"),
         attr(NameOID.COMMON_NAME, "ev")],
        ((("jurisdictionCountryName", "DE"),), (("businessCategory", "Private Organization"),),
         (("commonName", "ev"),)),
        "CN=ev,2.5.4.15=#0c1450726976617465204f7267616e697a6174696f6e,1.3.6.1.4.1.311.60.2.1.3=#13024445",
    ),
    "unknown_oid": (
        [attr(x509.ObjectIdentifier("1.3.6.1.4.1.99999.1"), "custom"), attr(NameOID.COMMON_NAME, "x")],
        ((("1.3.6.1.4.1.99999.1", "custom"),), (("commonName", "x"),)),
        "CN=x,1.3.6.1.4.1.99999.1=#0c06637573746f6d",
    ),
    "empty": ([], (), ""),
}


@pytest.mark.parametrize("case", sorted(SUBJECTS))
def test_x500_name_from_getpeercert_subject(case: str) -> None:
    _, subject, java = SUBJECTS[case]
    assert x500_name(subject) == java


def _certificate(rdns: list[R]) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name(rdns))
            .issuer_name(x509.Name([attr(NameOID.COMMON_NAME, "test ca")]))
            .public_key(key.public_key())
            .serial_number(1)
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(Encoding.DER)


@pytest.mark.parametrize("case", sorted(SUBJECTS))
def test_x500_name_from_der(case: str) -> None:
    rdns, _, java = SUBJECTS[case]
    assert x500_name_from_der(_certificate(rdns)) == java


def test_string_type_the_subject_tuple_cannot_show() -> None:
    # keytool writes PrintableString where it can; getpeercert() does not say so, the DER does.
    rdns = [R([A(NameOID.TITLE, "Boss", _ASN1Type.PrintableString)]),
            R([A(NameOID.COMMON_NAME, "PrintableCN", _ASN1Type.PrintableString)])]
    java = "CN=PrintableCN,2.5.4.12=#1304426f7373"
    assert x500_name_from_der(_certificate(rdns)) == java
    guessed = "CN=PrintableCN,2.5.4.12=#0c04426f7373"  # UTF8String: the usual type, not this one's
    assert x500_name(((("title", "Boss"),), (("commonName", "PrintableCN"),))) == guessed


def test_nul_and_non_ascii_in_a_subject_tuple() -> None:
    assert x500_name(((("commonName", "a\0b"),),)) == "CN=a\\00b"
    # a value PrintableString cannot hold must have been a UTF8String
    assert x500_name(((("serialNumber", "\u00e9"),),)) == "2.5.4.5=#0c02c3a9"
    assert x500_name(((("title", "x" * 200),),)) == "2.5.4.12=#0c81c8" + "78" * 200


def test_unknown_attribute_name() -> None:
    with pytest.raises(ValueError, match="unknown certificate subject attribute 'favouriteColour'"):
        x500_name(((("favouriteColour", "blue"),),))


@pytest.mark.parametrize("der", [b"", b"\x30\x03\x02\x01", b"\x04\x00", b"\x30\x00\x00", b"\x30\x80\x00\x00"])
def test_x500_name_from_der_refuses_non_certificates(der: bytes) -> None:
    with pytest.raises(ValueError, match="not a DER X.509 certificate"):
        x500_name_from_der(der)


def test_mapping_a_certificate_end_to_end() -> None:
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT")
    der = _certificate([attr(NameOID.ORGANIZATION_NAME, "Org"),
                        attr(NameOID.ORGANIZATIONAL_UNIT_NAME, "ServiceUsers"),
                        attr(NameOID.COMMON_NAME, "Orders-Service")])
    assert mapper.get_name(x500_name_from_der(der)) == "orders-service"
