"""identity.kerberos_rules: Kafka's KerberosNameTest, ported case for case, then more.

The cases after the port were run through Kafka's own KerberosShortNamer (apache/kafka trunk at
1eb7644, on OpenJDK 17) and the expectations are what it returned.
"""

from __future__ import annotations

import re

import pytest

from kafka_quota_proxy.identity.kerberos_rules import (
    JavaReplacement,
    KerberosName,
    KerberosShortNamer,
    MalformedKerberosName,
    NoMatchingRule,
    compile_java_regex,
)

REALM = "REALM.COM"

# --- KerberosNameTest ------------------------------------------------------------------------


def test_parse() -> None:
    namer = KerberosShortNamer.parse(
        [r"RULE:[1:$1](App\..*)s/App\.(.*)/$1/g", r"RULE:[2:$1](App\..*)s/App\.(.*)/$1/g", "DEFAULT"], REALM)

    name = KerberosName.parse("App.service-name/example.com@REALM.COM")
    assert name.service_name == "App.service-name"
    assert name.host_name == "example.com"
    assert name.realm == "REALM.COM"
    assert namer.short_name(name) == "service-name"

    name = KerberosName.parse("App.service-name@REALM.COM")
    assert name.service_name == "App.service-name"
    assert name.host_name is None
    assert name.realm == "REALM.COM"
    assert namer.short_name(name) == "service-name"

    name = KerberosName.parse("user/host@REALM.COM")
    assert name.service_name == "user"
    assert name.host_name == "host"
    assert name.realm == "REALM.COM"
    assert namer.short_name(name) == "user"


def _case_rules(suffix: str) -> list[str]:
    return [
        f"RULE:[1:$1]/{suffix}",
        f"RULE:[2:$1](Test.*)s/ABC///{suffix}",
        f"RULE:[2:$1](ABC.*)s/ABC/XYZ/g/{suffix}",
        rf"RULE:[2:$1](App\..*)s/App\.(.*)/$1/g/{suffix}",
        f"RULE:[2:$1]/{suffix}",
        "DEFAULT",
    ]


def test_to_lower_case() -> None:
    namer = KerberosShortNamer.parse(_case_rules("L"), REALM)
    assert namer.short_name("User@REALM.COM") == "user"
    assert namer.short_name("TestABC/host@FOO.COM") == "test"
    assert namer.short_name("ABC_User_ABC/host@FOO.COM") == "xyz_user_xyz"
    assert namer.short_name("App.SERVICE-name/example.com@REALM.COM") == "service-name"
    assert namer.short_name("User/root@REALM.COM") == "user"


def test_to_upper_case() -> None:
    namer = KerberosShortNamer.parse(_case_rules("U"), REALM)
    assert namer.short_name("User@REALM.COM") == "USER"
    assert namer.short_name("TestABC/host@FOO.COM") == "TEST"
    assert namer.short_name("ABC_User_ABC/host@FOO.COM") == "XYZ_USER_XYZ"
    assert namer.short_name("App.SERVICE-name/example.com@REALM.COM") == "SERVICE-NAME"
    assert namer.short_name("User/root@REALM.COM") == "USER"


@pytest.mark.parametrize("rule", [
    "default", "DEFAUL", "DEFAULT/L", "DEFAULT/g",
    "rule:[1:$1]", "rule:[1:$1]/L/U", "rule:[1:$1]/U/L", "rule:[1:$1]/LU",
    "RULE:[1:$1/L", "RULE:[1:$1]/l", "RULE:[2:$1](ABC.*)s/ABC/XYZ/L/g",
])
def test_invalid_rules(rule: str) -> None:
    with pytest.raises(ValueError, match=re.escape(rule)):
        KerberosShortNamer.parse([rule], REALM)


# --- More of Kafka's behaviour, as its classes computed it ------------------------------------

APP_RULES = [r"RULE:[1:$1](App\..*)s/App\.(.*)/$1/g", r"RULE:[2:$1](App\..*)s/App\.(.*)/$1/g", "DEFAULT"]


@pytest.mark.parametrize(("rules", "principal", "short"), [
    (APP_RULES, "App.x/y@OTHER", "x"),
    (APP_RULES, "user/@REALM.COM", "user"),  # an empty instance is still an instance
    (APP_RULES, "@REALM.COM", ""),
    # without '@' the name is returned as it is, slashes and all, whatever the rules
    (APP_RULES, "user", "user"),
    (APP_RULES, "user/host", "user/host"),
    ([], "a", "a"),
    # $0 is the realm, $1 and $2 the components
    (["RULE:[2:$1@$0](.*@REALM.COM)s/@.*//", "DEFAULT"], "nn/host@REALM.COM", "nn"),
    (["RULE:[2:$1@$0](.*@REALM.COM)s/@.*//", "DEFAULT"], "x@REALM.COM", "x"),
    (["RULE:[1:$1@$0](.*@REALM.COM)s/@.*//"], "joe@REALM.COM", "joe"),
    (["RULE:[1:$1]"], "a@X", "a"),
    (["RULE:[2:$2]"], "a/B@X", "B"),
    (["RULE:[1:$0$1]"], "a@X", "Xa"),
    (["RULE:[1:x$1y]/U"], "a@X", "XAY"),
    # sed: first match only, or every match with g; Java's replacement syntax
    (["RULE:[1:$1]s/a/x/"], "banana@X", "bxnana"),
    (["RULE:[1:$1]s/a/x/g"], "banana@X", "bxnxnx"),
    (["RULE:[1:$1]s/a*/-/g"], "banana@X", "-b--n--n--"),
    (["RULE:[1:$1]s/(a)(n)/$2$1/g"], "banana@X", "bnanaa"),
    (["RULE:[1:$1]s/(a)/$12/g"], "banana@X", "ba2na2na2"),  # $12 with one group is $1 then "2"
    ([r"RULE:[1:$1]s/(a)/\$1/g"], "banana@X", "b$1n$1n$1"),
    (["RULE:[1:$1]s/(?<v>a)/${v}${v}/g"], "banana@X", "baanaanaa"),
    ([r"RULE:[1:$1]s/\w+/w/"], "b\u00e4n@X", "w\u00e4n"),  # Java's \w is ASCII
    (["DEFAULT"], "a@REALM.COM", "a"),
])
def test_short_names_as_kafka_computes_them(rules: list[str], principal: str, short: str) -> None:
    assert KerberosShortNamer.parse(rules, REALM).short_name(principal) == short


@pytest.mark.parametrize(("rules", "principal", "message"), [
    (APP_RULES, "user@OTHER.COM",
     r"No rules apply to user@OTHER.COM, rules "
     r"[RULE:[1:$1](App\..*)s/App\.(.*)/$1/g, RULE:[2:$1](App\..*)s/App\.(.*)/$1/g, DEFAULT]"),
    (APP_RULES, "user@", "No rules apply to user@, rules"),
    (["DEFAULT"], "a/b@", "No rules apply to a/b@, rules [DEFAULT]"),
    (["RULE:[1:$1@$0](.*@REALM.COM)s/@.*//"], "joe@OTHER", "No rules apply to joe@OTHER"),
    (["RULE:[1:$1@$0](.*@REALM.COM)s/@.*//"], "joe/h@REALM.COM", "No rules apply to joe/h@REALM.COM"),
    (["RULE:[1:$1]"], "a/b@X", "No rules apply to a/b@X, rules [RULE:[1:$1]]"),
    ([], "a@X", "No rules apply to a@X, rules []"),
    # a rule that applies but leaves '/' or '@' stops the search, as in Kafka
    (["RULE:[2:$1/$2]", "DEFAULT"], "a/b@REALM.COM",
     "Non-simple name a/b after auth_to_local rule RULE:[2:$1/$2]"),
    (["RULE:[1:$1]s/a/@/"], "bab@X", "Non-simple name b@b after auth_to_local rule RULE:[1:$1]s/a/@/"),
])
def test_no_matching_rule(rules: list[str], principal: str, message: str) -> None:
    with pytest.raises(NoMatchingRule) as e:
        KerberosShortNamer.parse(rules, REALM).short_name(principal)
    assert str(e.value).startswith(message)


def test_default_realm_as_a_broker_without_krb5_conf_has_it() -> None:
    # Kafka's SaslChannelBuilder falls back to "" when there is no default realm.
    namer = KerberosShortNamer.parse(["DEFAULT"], "")
    assert namer.short_name("a@") == "a"
    with pytest.raises(NoMatchingRule):
        namer.short_name("a@X")


def test_malformed_name() -> None:
    with pytest.raises(MalformedKerberosName, match="Malformed Kerberos name: a/b/c@R"):
        KerberosShortNamer.parse(APP_RULES, REALM).short_name("a/b/c@R")
    assert issubclass(MalformedKerberosName, ValueError)


@pytest.mark.parametrize("rule", [
    "RULE:[1:$1]/", "RULE:[1:$1]s/a/b/", "RULE:[1:$1]s/a/b/g", "RULE:[1:$1]s/a/b/g/L", "RULE:[1:$1]s/a/b/gL",
    "RULE:[1:$1]()", "RULE:[01:$1]", "RULE:[1:]", "DEFAULT",
])
def test_rules_kafka_accepts(rule: str) -> None:
    KerberosShortNamer.parse([rule], REALM)


@pytest.mark.parametrize("rule", [
    "RULE:[:$1]", "RULE:[1:$1](a)(b)", "RULE:[1:$1]s/(/x/", " DEFAULT", "DEFAULT ",
    "RULE:[1:$1] ", "RULE:[1:$1](?i)BAN.*", "RULE:[99999999999:$1]",
])
def test_rules_kafka_refuses(rule: str) -> None:
    with pytest.raises(ValueError, match="Invalid rule"):
        KerberosShortNamer.parse([rule], REALM)


def test_empty_and_missing_rules() -> None:
    assert KerberosShortNamer.parse(None, REALM).short_name("a@REALM.COM") == "a"  # Kafka's default, DEFAULT
    assert KerberosShortNamer.parse([], REALM).rules == ()


def test_str_is_the_rule_text_and_the_name() -> None:
    namer = KerberosShortNamer.parse(APP_RULES, REALM)
    assert [str(r) for r in namer.rules] == APP_RULES
    assert str(KerberosName.parse("a/b@R")) == "a/b@R"
    assert str(KerberosName.parse("a@")) == "a@"
    assert str(KerberosName.parse("a/b")) == "a/b"


# --- Deliberate differences -------------------------------------------------------------------


def test_no_default_realm_means_default_strips_any_realm() -> None:
    namer = KerberosShortNamer.parse(["DEFAULT"])
    assert namer.short_name("alice@EXAMPLE.COM") == "alice"
    assert namer.short_name("kafka/broker1.example.com@OTHER.ORG") == "kafka"
    assert namer.short_name("alice@") == "alice"


@pytest.mark.parametrize(("rule", "why"), [
    # Kafka parses these and throws on the first principal the rule is tried on
    ("RULE:[1:$1$2]", "index 2 from $1$2 is outside of the valid range 0 to 1"),
    ("RULE:[1:$10]", "index 10 from $10 is outside of the valid range 0 to 1"),
    ("RULE:[1:$]", "'$' without a number"),
    ("RULE:[1:$1]s/a/$2/", "refers to group 2; the pattern has 0"),
    (r"RULE:[1:$1]s/a/\/", "lone backslash"),
    ("RULE:[1:$1]s/a/$/", "'$' without a group"),
    ("RULE:[1:$1]s/a/${x}/", "names group 'x'"),
    ("RULE:[1:$1]s/a/$x/", "not followed by a group number"),
    # Java-only regex syntax that Python would read differently or not at all
    (r"RULE:[1:$1](\p{Alpha}+)", "Java and Python"),
    (r"RULE:[1:$1](\Qa.b\E)", "Java and Python"),
    ("RULE:[1:$1]([a-z&&[^b]]+)", "Java and Python"),
])
def test_rules_refused_when_parsed(rule: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)) as e:
        KerberosShortNamer.parse([rule], REALM)
    assert rule in str(e.value)


def test_a_single_string_is_not_a_list_of_rules() -> None:
    with pytest.raises(TypeError):
        KerberosShortNamer.parse("DEFAULT", REALM)


# --- The Java regex pieces --------------------------------------------------------------------


def test_java_named_groups_and_ascii_classes() -> None:
    p = compile_java_regex(r"(?<user>\w+)@(?<=@)(?<!x)[(?<]*")
    assert p.fullmatch("bob@") is not None
    assert p.groupindex == {"user": 1}
    assert compile_java_regex(r"\d+").fullmatch("\u0661") is None  # Arabic-Indic one is not \d in Java
    assert compile_java_regex(r"[]a]+").fullmatch("]a") is not None


@pytest.mark.parametrize(("replacement", "expected"), [
    ("<$1>", "<b>"),
    ("$0$0", "abab"),
    ("$12", "b2"),
    ("$01", "b"),
    (r"\$1\\", "$1\\"),
    ("${g}", "b"),
    ("$2", ""),  # an unmatched group adds nothing
])
def test_java_replacement(replacement: str, expected: str) -> None:
    pattern = compile_java_regex("a(?<g>b)(c)?")
    m = pattern.fullmatch("ab")
    assert m is not None
    assert JavaReplacement.parse(replacement, pattern).expand(m) == expected
