"""Kafka's `sasl.kerberos.principal.to.local.rules`: Kerberos principal -> short name.

This is Kafka's KerberosShortNamer (and KerberosName, KerberosRule) in Python, so the proxy
charges quotas to the same principal name the broker's DefaultKafkaPrincipalBuilder produces
for a GSSAPI client. The rule grammar, the order rules are tried in, the `$n` parameters, the
sed-style substitution and the `/L` `/U` suffixes all follow Kafka; deliberate differences are
listed on `KerberosShortNamer`.

The rules carry Java regular expressions. `compile_java_regex` and `JavaReplacement` give the
part of java.util.regex they need with Python's `re`; the SSL mapping rules use them too.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "JavaReplacement",
    "KerberosName",
    "KerberosRule",
    "KerberosShortNamer",
    "MalformedKerberosName",
    "NoMatchingRule",
    "compile_java_regex",
]


class NoMatchingRule(LookupError):
    """No rule maps this principal (Kafka throws NoMatchingRule and fails the authentication)."""


class MalformedKerberosName(ValueError):
    """A principal with an '@' that is not `primary[/instance]@REALM`."""


# --- Java regular expressions on Python's re --------------------------------------------------

# Java's \d \w \s \b are ASCII-only unless UNICODE_CHARACTER_CLASS is set, and so is (?i).
_JAVA_FLAGS = re.ASCII


def compile_java_regex(pattern: str) -> re.Pattern[str]:
    """Compile a java.util.regex pattern with Python's re, or raise ValueError.

    The syntax both engines share (classes, groups, greedy/lazy/possessive quantifiers,
    lookaround, anchors, inline flags) means the same thing; Java's named groups `(?<name>...)`
    are translated. Java-only syntax (`\\Q...\\E`, `\\p{...}`, `\\z`, `[a-z&&[^b]]`) is refused
    instead of being silently read as something else. Still different, and documented rather
    than emulated: Java's `.` and `$` also treat `\\r`, U+0085, U+2028 and U+2029 as line ends.
    """
    translated = _python_group_syntax(pattern)
    try:
        with warnings.catch_warnings():
            # Python warns (and reads literally) where Java means set intersection or nesting.
            warnings.simplefilter("error", FutureWarning)
            return re.compile(translated, _JAVA_FLAGS)
    except (re.error, FutureWarning) as e:
        raise ValueError(
            f"not a regular expression both Java and Python read alike: {pattern!r} ({e})") from e


def _python_group_syntax(pattern: str) -> str:
    """Rewrite Java's `(?<name>` as Python's `(?P<name>`, leaving escapes and classes alone."""
    out: list[str] = []
    i = 0
    in_class = False
    n = len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            # A ']' straight after '[' or '[^' is a literal, not the end of the class.
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                out.append(pattern[i : j + 1])
                i = j + 1
                continue
        elif pattern.startswith("(?<", i) and i + 3 < n and pattern[i + 3].isalpha():
            out.append("(?P<")
            i += 3
            continue
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class JavaReplacement:
    """A Matcher.replaceAll/replaceFirst replacement string, parsed once against its pattern.

    Java's rules: `\\x` is the literal x; `$n` is group n, taking further digits only while the
    number stays a group of the pattern (`$12` with 3 groups is group 1 then "2"); `${name}` is
    a named group; an unmatched group adds nothing. What Java would throw while replacing (a
    trailing backslash, `$` without a group, a group the pattern lacks) is a ValueError here,
    when the rule is parsed.
    """

    parts: tuple[str | int, ...]

    @classmethod
    def parse(cls, replacement: str, pattern: re.Pattern[str]) -> JavaReplacement:
        parts: list[str | int] = []
        literal: list[str] = []
        i = 0
        n = len(replacement)
        while i < n:
            c = replacement[i]
            if c == "\\":
                if i + 1 == n:
                    raise ValueError("the replacement ends in a lone backslash")
                literal.append(replacement[i + 1])
                i += 2
                continue
            if c != "$":
                literal.append(c)
                i += 1
                continue
            i += 1
            if i == n:
                raise ValueError("the replacement ends in '$' without a group")
            if replacement[i] == "{":
                end = i + 1
                while end < n and replacement[end].isascii() and replacement[end].isalnum():
                    end += 1
                name = replacement[i + 1 : end]
                if not name or end == n or replacement[end] != "}" or name[0].isdigit():
                    raise ValueError("the replacement has a bad ${name} group reference")
                if name not in pattern.groupindex:
                    raise ValueError(f"the replacement names group {name!r}, which the pattern lacks")
                group = pattern.groupindex[name]
                i = end + 1
            else:
                if not ("0" <= replacement[i] <= "9"):
                    raise ValueError("the replacement has a '$' not followed by a group number")
                group = int(replacement[i])
                i += 1
                while i < n and "0" <= replacement[i] <= "9":
                    longer = group * 10 + int(replacement[i])
                    if longer > pattern.groups:
                        break
                    group = longer
                    i += 1
                if group > pattern.groups:
                    raise ValueError(
                        f"the replacement refers to group {group}; the pattern has {pattern.groups}")
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(group)
        if literal:
            parts.append("".join(literal))
        return cls(tuple(parts))

    def expand(self, match: re.Match[str]) -> str:
        return "".join(p if isinstance(p, str) else (match.group(p) or "") for p in self.parts)


# --- Kerberos names --------------------------------------------------------------------------

_NAME_PARSER = re.compile(r"([^/@]*)(?:/([^/@]*))?@([^/@]*)")


@dataclass(frozen=True, slots=True)
class KerberosName:
    """A Kerberos principal split like Kafka's KerberosName: `service[/host]@realm`.

    A name without '@' is kept whole as `service_name`, slashes included (Kafka does the same,
    and its short name is then the name unchanged).
    """

    service_name: str
    host_name: str | None = None
    realm: str | None = None

    @classmethod
    def parse(cls, principal_name: str) -> KerberosName:
        m = _NAME_PARSER.fullmatch(principal_name)
        if m is None:
            if "@" in principal_name:
                raise MalformedKerberosName(f"Malformed Kerberos name: {principal_name}")
            return cls(principal_name)
        return cls(m.group(1), m.group(2), m.group(3))

    def __str__(self) -> str:
        host = "" if self.host_name is None else "/" + self.host_name
        realm = "" if self.realm is None else "@" + self.realm
        return self.service_name + host + realm


# --- Rules -----------------------------------------------------------------------------------

# Kafka's rule grammar, group for group: DEFAULT, or RULE:[n:format](match)s/from/to/g then an
# optional '/' and L or U. Kafka matches it from the start (lookingAt) and then demands that it
# reached the end, so we do the same rather than fullmatch (which could backtrack differently).
_RULE_PARSER = re.compile(
    r"((DEFAULT)|((RULE:\[([0-9]*):([^\]]*)](\(([^)]*)\))?(s/([^/]*)/([^/]*)/(g)?)?/?(L|U)?)))"
)
_PARAMETER = re.compile(r"([^$]*)(\$([0-9]*))?")
_NON_SIMPLE = re.compile(r"[/@]")
_JAVA_INT_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class KerberosRule:
    """One parsed `sasl.kerberos.principal.to.local.rules` entry (Kafka's KerberosRule)."""

    text: str
    is_default: bool
    num_components: int = 0
    # The format with `$n` already split out: literal text, or the index into
    # [realm, component1, component2].
    format: tuple[str | int, ...] = ()
    match: re.Pattern[str] | None = None
    from_pattern: re.Pattern[str] | None = None
    to_pattern: JavaReplacement | None = None
    repeat: bool = False
    to_lower_case: bool = False
    to_upper_case: bool = False

    @classmethod
    def parse(cls, rule: str) -> KerberosRule:
        m = _RULE_PARSER.match(rule)
        if m is None:
            raise ValueError(f"Invalid rule: {rule}")
        if m.end() != len(rule):
            raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[m.end():]}`")
        if m.group(2) is not None:
            return cls(text=rule, is_default=True)
        if not m.group(5) or int(m.group(5)) > _JAVA_INT_MAX:
            raise ValueError(f"Invalid rule: `{rule}`, bad number of components `{m.group(5)}`")
        n = int(m.group(5))
        try:
            from_pattern = None if m.group(10) is None else compile_java_regex(m.group(10))
            to_pattern = None
            if from_pattern is not None:
                to_pattern = JavaReplacement.parse(m.group(11), from_pattern)
            return cls(
                text=rule,
                is_default=False,
                num_components=n,
                format=_parse_format(m.group(6), n),
                match=None if m.group(8) is None else compile_java_regex(m.group(8)),
                from_pattern=from_pattern,
                to_pattern=to_pattern,
                repeat=m.group(12) == "g",
                to_lower_case=m.group(13) == "L",
                to_upper_case=m.group(13) == "U",
            )
        except ValueError as e:
            raise ValueError(f"Invalid rule: `{rule}`: {e}") from e

    def apply(self, params: Sequence[str], default_realm: str | None) -> str | None:
        """The short name for `[realm, component, ...]`, or None if this rule does not apply.

        Raises NoMatchingRule when the rule applies but leaves a '/' or '@' in the name, as
        Kafka does: such a name is never a usable short name.
        """
        result: str | None = None
        if self.is_default:
            if default_realm is None or default_realm == params[0]:
                result = params[1]
        elif len(params) - 1 == self.num_components:
            base = "".join(p if isinstance(p, str) else params[p] for p in self.format)
            if self.match is None or self.match.fullmatch(base):
                if self.from_pattern is None or self.to_pattern is None:
                    result = base
                else:
                    result = self.from_pattern.sub(self.to_pattern.expand, base,
                                                   count=0 if self.repeat else 1)
        if result is not None and _NON_SIMPLE.search(result):
            raise NoMatchingRule(f"Non-simple name {result} after auth_to_local rule {self.text}")
        if result is not None and self.to_lower_case:
            return result.lower()
        if result is not None and self.to_upper_case:
            return result.upper()
        return result

    def __str__(self) -> str:
        return self.text


def _parse_format(fmt: str, num_components: int) -> tuple[str | int, ...]:
    """Split a rule's `[n:format]` into literals and `$k` indexes, as Kafka's replaceParameters.

    Kafka only notices a bad `$` while mapping a name with exactly n components; the rule can do
    nothing else then, so we refuse it up front.
    """
    parts: list[str | int] = []
    start = 0
    while start < len(fmt):
        m = _PARAMETER.match(fmt, start)
        assert m is not None  # the pattern matches the empty string
        if m.group(1):
            parts.append(m.group(1))
        if m.group(2) is not None:
            digits = m.group(3)
            if not digits:
                raise ValueError(f"bad format in username mapping in {fmt!r}: '$' without a number")
            index = int(digits)
            if index > num_components:
                raise ValueError(
                    f"index {index} from {fmt} is outside of the valid range 0 to {num_components}")
            parts.append(index)
        start = m.end()
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class KerberosShortNamer:
    """Kafka's KerberosShortNamer: the first rule that applies gives a principal's short name.

    `default_realm` is the realm a `DEFAULT` rule strips. A broker takes it from its krb5.conf
    (and uses "" when it has none); the proxy has no Kerberos configuration, so it is given
    here, and None means DEFAULT strips any realm. Set it to the brokers' realm to get exactly
    the brokers' mapping.

    Deliberate differences from Kafka: a rule whose `[n:format]` has a bare `$` or a `$k` beyond
    n is refused when parsed (Kafka fails on the first name that reaches it), and so is a
    replacement Java would reject, or a regex Python cannot read as Java does.
    """

    rules: tuple[KerberosRule, ...]
    default_realm: str | None = None

    @classmethod
    def parse(
        cls, rules: Sequence[str] | None = None, default_realm: str | None = None
    ) -> KerberosShortNamer:
        """Parse the rules in order; None is Kafka's default, `["DEFAULT"]`."""
        if isinstance(rules, str):
            # A bare string would otherwise be taken one character at a time.
            raise TypeError("rules must be a list of rule strings, not one string")
        texts = ["DEFAULT"] if rules is None else list(rules)
        return cls(tuple(KerberosRule.parse(r) for r in texts), default_realm)

    def short_name(self, principal: str | KerberosName) -> str:
        """The short name of `primary[/instance][@REALM]`; raise NoMatchingRule if no rule applies."""
        name = KerberosName.parse(principal) if isinstance(principal, str) else principal
        if name.realm is None:
            # Already simple (no '@'): Kafka returns it as it is, whatever the rules say.
            return name.service_name
        params = [name.realm, name.service_name]
        if name.host_name is not None:
            params.append(name.host_name)
        for rule in self.rules:
            result = rule.apply(params, self.default_realm)
            if result is not None:
                return result
        raise NoMatchingRule(f"No rules apply to {name}, rules [{', '.join(r.text for r in self.rules)}]")
