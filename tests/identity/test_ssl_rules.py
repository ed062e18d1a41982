"""identity.ssl_rules: Kafka's SslPrincipalMapperTest, ported case for case, then more.

The mapping cases after the port were run through Kafka's own SslPrincipalMapper (apache/kafka
trunk at 1eb7644, on OpenJDK 17), and the expected DNs are what OpenJDK 17's
`X509Certificate.getSubjectX500Principal().getName()` printed for certificates with those
subjects; the expectations are what they returned.
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

from kafka_quota_proxy.identity.ssl_rules import (
    NoMatchingRule,
    SslPrincipalMapper,
    x500_name,
    x500_name_from_der,
)

# --- SslPrincipalMapperTest ------------------------------------------------------------------


@pytest.mark.parametrize("rules", [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
])
def test_valid_rules(rules: str) -> None:
    SslPrincipalMapper.from_rules(rules)


@pytest.mark.parametrize("rules", [
    "default",
    "DEFAUL",
    "DEFAULT/L",
    "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
])
def test_invalid_rules(rules: str) -> None:
    with pytest.raises(ValueError, match="Invalid rule"):
        SslPrincipalMapper.from_rules(rules)


def test_ssl_principal_mapper() -> None:
    mapper = SslPrincipalMapper.from_rules(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]))
    assert mapper.get_name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.get_name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.get_name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.get_name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.get_name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"


@pytest.mark.parametrize(("expected", "rules"), [
    # seeing is believing
    ("[]", ""),
    ("[DEFAULT]", "DEFAULT"),
    ("[RULE:/]", "RULE://"),
    ("[RULE:/.*]", "RULE:/.*/"),
    ("[RULE:/.*/L]", "RULE:/.*/L"),
    ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
    ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
    ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
    ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
    ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
     "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
    # empty rules are ignored
    ("[]", ",   , , ,      , , ,   "),
    ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
    ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
    ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
    # escape sequences
    (r"[RULE:\/\\\(\)\n\t/\/\/]", r"RULE:\/\\\(\)\n\t/\/\//"),
    (r"[RULE:\**\/+/*/L, RULE:\/*\**/**]", r"RULE:\**\/+/*/L,RULE:\/*\**/**/"),
    # rules rule
    (r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
     r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT"),
])
def test_rules_splitting(expected: str, rules: str) -> None:
    assert str(SslPrincipalMapper.from_rules(rules)) == f"SslPrincipalMapper(rules = {expected})"


def test_comma_with_whitespace() -> None:
    mapper = SslPrincipalMapper.from_rules(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.get_name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


# --- More of Kafka's behaviour, as its classes computed it ------------------------------------


@pytest.mark.parametrize(("rules", "dn", "name"), [
    # replaceAll over the whole DN: a pattern that also matches the empty string replaces twice
    ("RULE:.*/x/", "abc", "xx"),
    ("RULE:(.*)/[$1]/", "abc", "[abc][]"),
    ("RULE:b*/-/", "bbb", "--"),
    ("RULE:.*/Y/L", "abc", "yy"),
    # back references: unmatched groups are empty, unknown ones literal (Kafka's NiFi pre-pass)
    ("RULE:(a)(b)?/$2$1/", "a", "a"),
    ("RULE:(a)/$2/", "a", "$2"),
    ("RULE:(a)/$12/", "a", "a2"),
    ("RULE:(a)/$01/", "a", "a"),
    ("RULE:(a)/$0$0/", "a", "aa"),
    (r"RULE:(a)/\$1/", "a", "$1"),
    ("RULE:a/$0/", "a", "a"),
    ("RULE:(?<n>a)/${n}!/", "a", "a!"),
    ("RULE:[a-z]+/$0$0/U", "ab", "ABAB"),
    ("RULE:(?i)ABC/ok/", "abc", "ok"),
    # Java's case mapping in Locale.ENGLISH
    ("RULE:(.*)/$1/L", "\u0130stanbul", "i\u0307stanbul"),
    ("RULE:(.*)/$1/U", "stra\u00dfe", "STRASSE"),
    ("RULE:CN=([^,]+).*/$1/,\nDEFAULT", "O=y", "O=y"),
])
def test_names_as_kafka_computes_them(rules: str, dn: str, name: str) -> None:
    assert SslPrincipalMapper.from_rules(rules).get_name(dn) == name


@pytest.mark.parametrize(("rules", "dn"), [
    ("RULE:x/y/", "abc"),
    (r"RULE:\w+/w/", "\u00e4bc"),  # Java's \w is ASCII
    ("", "CN=a"),
])
def test_no_matching_rule(rules: str, dn: str) -> None:
    with pytest.raises(NoMatchingRule, match=f"No rules apply to {dn}, rules"):
        SslPrincipalMapper.from_rules(rules).get_name(dn)


@pytest.mark.parametrize("rules", [
    "RULE:(a/$1/", r"RULE:a/\/", "DEFAULT,RULE:x/y/,junk", "RULE:x/y/Lx", "RULE:x/y/ L",
])
def test_more_invalid_rules(rules: str) -> None:
    with pytest.raises(ValueError, match="Invalid rule"):
        SslPrincipalMapper.from_rules(rules)


def test_no_rules_is_kafkas_default() -> None:
    assert str(SslPrincipalMapper.from_rules(None)) == "SslPrincipalMapper(rules = [DEFAULT])"


# --- Deliberate differences -------------------------------------------------------------------


def test_a_line_break_separates_rules() -> None:
    # Kafka splits this at the comma inside [^,] and refuses it; one rule per line works here.
    mapper = SslPrincipalMapper.from_rules("RULE:CN=([^,]+).*/$1/\nDEFAULT")
    assert mapper.get_name("CN=x,O=y") == "x"
    assert mapper.get_name("O=y") == "O=y"
    yaml_block = "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L\r\n  RULE:^CN=([^,]+),.*$/$1/\n  DEFAULT\n"
    assert str(SslPrincipalMapper.from_rules(yaml_block)) == (
        "SslPrincipalMapper(rules = "
        "[RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, RULE:^CN=([^,]+),.*$/$1, DEFAULT])")


@pytest.mark.parametrize(("rules", "why"), [
    # Kafka parses these and throws on the first DN the rule matches
    ("RULE:a/$1/", "refers to group 1; the pattern has 0"),
    ("RULE:(a)/$/", "'$' without a group"),
    ("RULE:(a)(b)/$3$4/", "refers to group 4; the pattern has 2"),
    (r"RULE:\p{Lu}/x/", "Java and Python"),
])
def test_rules_refused_when_parsed(rules: str, why: str) -> None:
    with pytest.raises(ValueError, match="Invalid rule") as e:
        SslPrincipalMapper.from_rules(rules)
    assert why in str(e.value)


# --- X500Principal.getName() ----------------------------------------------------------------

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
