"""identity.ssl_rules: Kafka's SslPrincipalMapperTest, ported case for case, then more.

The mapping cases after the port were run through Kafka's own SslPrincipalMapper (apache/kafka
trunk at 1eb7644, on OpenJDK 17); the expectations are what it returned.
"""

from __future__ import annotations

import pytest

from kafka_quota_proxy.identity.ssl_rules import NoMatchingRule, SslPrincipalMapper

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
