"""Kafka's `ssl.principal.mapping.rules`: how an mTLS client's certificate subject becomes its principal.

`SslPrincipalMapper` is Kafka's SslPrincipalMapper in Python: the rules are split, parsed and
tried exactly as the broker does, so an mTLS client gets the same principal name from the proxy
as from the broker. The broker applies them to `X500Principal.getName()`, the RFC 2253 form of
the client certificate's subject; `identity.x500` prints that same string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kafka_quota_proxy.identity.kerberos_rules import JavaReplacement, compile_java_regex

__all__ = [
    "NoMatchingRule",
    "SslPrincipalMapper",
    "SslPrincipalRule",
]


class NoMatchingRule(LookupError):
    """No rule maps this distinguished name (Kafka throws NoMatchingRule and fails the handshake)."""


# --- Rules -----------------------------------------------------------------------------------

# Kafka's grammar verbatim: DEFAULT, or RULE:pattern/replacement/ with an optional L or U, where
# '\' escapes the next character; anything else becomes a rule of its own that then fails to
# parse. The splitter finds each rule followed by a comma or the end.
_RULE_PATTERN = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
# re.ASCII: Java's \s is [ \t\n\x0B\f\r], not Unicode whitespace.
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)", re.ASCII)
_RULE_PARSER = re.compile(_RULE_PATTERN, re.ASCII)
_BACK_REFERENCE = re.compile(r"\$([0-9]+)")


@dataclass(frozen=True, slots=True)
class SslPrincipalRule:
    """One parsed `ssl.principal.mapping.rules` entry (Kafka's SslPrincipalMapper.Rule)."""

    is_default: bool
    pattern_text: str = ""
    replacement_text: str = ""
    pattern: re.Pattern[str] | None = None
    replacement: JavaReplacement | None = None
    to_lower_case: bool = False
    to_upper_case: bool = False

    @classmethod
    def parse(cls, rule: str) -> SslPrincipalRule | None:
        """Parse one rule; None for an empty one (Kafka ignores those)."""
        m = _RULE_PARSER.match(rule)
        if m is None:
            raise ValueError(f"Invalid rule: {rule}")
        if m.end() != len(rule):
            raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[m.end():]}`")
        if m.group(1) is not None:
            return cls(is_default=True)
        if m.group(2) is None:
            return None
        pattern_text, replacement_text = m.group(2), m.group(4)
        try:
            pattern = compile_java_regex(pattern_text)
            replacement = JavaReplacement.parse(
                _escape_literal_back_references(replacement_text, pattern.groups), pattern)
        except ValueError as e:
            raise ValueError(f"Invalid rule: `{rule}`: {e}") from e
        return cls(
            is_default=False,
            pattern_text=pattern_text,
            replacement_text=replacement_text,
            pattern=pattern,
            replacement=replacement,
            to_lower_case=m.group(6) == "L",
            to_upper_case=m.group(6) == "U",
        )

    def apply(self, distinguished_name: str) -> str | None:
        """The principal name if the whole DN matches this rule, else None."""
        if self.is_default:
            return distinguished_name
        assert self.pattern is not None and self.replacement is not None
        if not self.pattern.fullmatch(distinguished_name):
            return None
        # Kafka replaces every match in the DN, not only the full match it tested (so a pattern
        # that can match the empty string also replaces at the end, as Java does).
        result = self.pattern.sub(self.replacement.expand, distinguished_name)
        if self.to_lower_case:
            return result.lower()
        if self.to_upper_case:
            return result.upper()
        return result

    def __str__(self) -> str:
        # Kafka's Rule.toString, which its tests (and its log lines) show.
        if self.is_default:
            return "DEFAULT"
        case = "/L" if self.to_lower_case else "/U" if self.to_upper_case else ""
        return f"RULE:{self.pattern_text}/{self.replacement_text}{case}"


def _escape_literal_back_references(replacement: str, groups: int) -> str:
    """Kafka's (from Apache NiFi) pre-pass: a `$n` naming no group of the pattern is literal text.

    A reference is first cut down digit by digit (`$123` -> `$12` -> `$1`) while that names no
    group; if even the one-digit form names none, its '$' is escaped. With no groups at all the
    replacement is left alone, so a `$1` there is an error (Java throws when mapping; we refuse
    the rule). Kafka works out positions in the original string while inserting into a copy;
    we do the same, so two unknown references in one replacement behave as in Kafka.
    """
    if groups == 0:
        return replacement
    value = replacement
    for m in _BACK_REFERENCE.finditer(replacement):
        digits = m.group(1)
        if digits.startswith("0"):
            continue
        index = int(digits)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            at = m.start(1)
            value = value[: at - 1] + "\\" + value[at - 1 :]
    return value


@dataclass(frozen=True, slots=True)
class SslPrincipalMapper:
    """Kafka's SslPrincipalMapper: the first rule whose pattern matches the whole DN names it.

    Rules are separated by commas, with any whitespace around them, as Kafka splits its
    `ssl.principal.mapping.rules` string. One deliberate difference: a line break also ends a
    rule here (so a YAML block or one rule per line works), where Kafka misreads the text (it
    can split inside a rule and refuse it); a pattern that needs a line break can write `\\n`.
    """

    rules: tuple[SslPrincipalRule, ...]

    @classmethod
    def from_rules(cls, rules: str | None) -> SslPrincipalMapper:
        """Parse an `ssl.principal.mapping.rules` value; None is Kafka's default, DEFAULT."""
        text = "DEFAULT" if rules is None else ",".join(rules.splitlines())
        parsed = (SslPrincipalRule.parse(m.group(1)) for m in _RULE_SPLITTER.finditer(_java_trim(text)))
        return cls(tuple(r for r in parsed if r is not None))

    def get_name(self, distinguished_name: str) -> str:
        """The principal name for an RFC 2253 DN; raise NoMatchingRule if no rule applies."""
        for rule in self.rules:
            name = rule.apply(distinguished_name)
            if name is not None:
                return name
        rules = ", ".join(map(str, self.rules))
        raise NoMatchingRule(f"No rules apply to {distinguished_name}, rules [{rules}]")

    def __str__(self) -> str:
        return f"SslPrincipalMapper(rules = [{', '.join(map(str, self.rules))}])"


def _java_trim(text: str) -> str:
    """String.trim(): strip every character up to U+0020 from both ends, and nothing else."""
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    return text[start:end]
