"""A certificate subject as Java's `X500Principal.getName()` prints it (RFC 2253), the string
Kafka's `ssl.principal.mapping.rules` (identity.ssl_rules) are applied to.

`x500_name` works from `ssl.SSLSocket.getpeercert()`'s decoded subject and has to guess the
ASN.1 string types; `x500_name_from_der` reads them from the DER certificate
(`getpeercert(binary_form=True)`), with a small DER reader of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["x500_name", "x500_name_from_der"]

# The attribute types Java prints by keyword in RFC 2253 form; every other type is printed as
# its dotted OID with the value as '#' and the hex of its DER encoding.
_RFC2253_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.6": "C",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}

_UTF8_STRING = 0x0C
_PRINTABLE_STRING = 0x13
_IA5_STRING = 0x16
# The string types Java prints as text (X500Principal's isDerString, non-canonical form).
_STRING_TAGS = frozenset({_UTF8_STRING, _PRINTABLE_STRING, 0x14, _IA5_STRING, 0x1B, 0x1E})

# getpeercert() names attribute types by OpenSSL's long name; it drops the ASN.1 string type,
# which Java's '#hex' form shows. For those types this guesses the type the standards fix
# (IA5String for emailAddress, PrintableString for serialNumber and the like) or, for a
# DirectoryString, UTF8String, which OpenSSL, cryptography and RFC 5280 use by default.
# A certificate that chose otherwise (keytool writes PrintableString when it can) prints
# differently: use x500_name_from_der, which reads the real type.
_OPENSSL_ATTRIBUTES: dict[str, tuple[str, int]] = {
    "commonName": ("2.5.4.3", _UTF8_STRING),
    "surname": ("2.5.4.4", _UTF8_STRING),
    "serialNumber": ("2.5.4.5", _PRINTABLE_STRING),
    "countryName": ("2.5.4.6", _PRINTABLE_STRING),
    "localityName": ("2.5.4.7", _UTF8_STRING),
    "stateOrProvinceName": ("2.5.4.8", _UTF8_STRING),
    "streetAddress": ("2.5.4.9", _UTF8_STRING),
    "organizationName": ("2.5.4.10", _UTF8_STRING),
    "organizationalUnitName": ("2.5.4.11", _UTF8_STRING),
    "title": ("2.5.4.12", _UTF8_STRING),
    "description": ("2.5.4.13", _UTF8_STRING),
    "businessCategory": ("2.5.4.15", _UTF8_STRING),
    "postalCode": ("2.5.4.17", _UTF8_STRING),
    "postOfficeBox": ("2.5.4.18", _UTF8_STRING),
    "physicalDeliveryOfficeName": ("2.5.4.19", _UTF8_STRING),
    "telephoneNumber": ("2.5.4.20", _PRINTABLE_STRING),
    "name": ("2.5.4.41", _UTF8_STRING),
    "givenName": ("2.5.4.42", _UTF8_STRING),
    "initials": ("2.5.4.43", _UTF8_STRING),
    "generationQualifier": ("2.5.4.44", _UTF8_STRING),
    "dnQualifier": ("2.5.4.46", _PRINTABLE_STRING),
    "pseudonym": ("2.5.4.65", _UTF8_STRING),
    "role": ("2.5.4.72", _UTF8_STRING),
    "organizationIdentifier": ("2.5.4.97", _UTF8_STRING),
    "emailAddress": ("1.2.840.113549.1.9.1", _IA5_STRING),
    "unstructuredName": ("1.2.840.113549.1.9.2", _UTF8_STRING),
    "userId": ("0.9.2342.19200300.100.1.1", _UTF8_STRING),
    "rfc822Mailbox": ("0.9.2342.19200300.100.1.3", _IA5_STRING),
    "domainComponent": ("0.9.2342.19200300.100.1.25", _IA5_STRING),
    "jurisdictionLocalityName": ("1.3.6.1.4.1.311.60.2.1.1", _UTF8_STRING),
    "jurisdictionStateOrProvinceName": ("1.3.6.1.4.1.311.60.2.1.2", _UTF8_STRING),
    "jurisdictionCountryName": ("1.3.6.1.4.1.311.60.2.1.3", _PRINTABLE_STRING),
}
_DOTTED_OID = re.compile(r"[0-2](\.[0-9]+)+", re.ASCII)

# Characters Java's X500Principal backslash-escapes anywhere in a value (RFC 2253's seven plus
# '=' and '#'); NUL becomes \00, and leading and trailing spaces and CRs get a backslash.
_ESCAPEES = frozenset(',=+<>#;"\\')


def x500_name(subject: Iterable[Iterable[tuple[str, str]]]) -> str:
    """The RFC 2253 DN Java's `X500Principal.getName()` gives for a getpeercert() 'subject'.

    `subject` is the certificate's RDN sequence as Python decodes it, most general RDN first
    (C, then O, ...); the DN lists them most specific first, multi-valued RDNs joined by '+'.
    CN, L, ST, O, OU, C, STREET, DC and UID print by keyword. Every other type prints as Java
    prints it, `OID=#hex-of-DER` (emailAddress is `1.2.840.113549.1.9.1=#16...`); since Python
    does not say which string type the certificate used, see `_OPENSSL_ATTRIBUTES` for the guess.
    Python names a type OpenSSL does not know by its dotted OID, which is accepted too.
    """
    rdns: list[str] = []
    for rdn in subject:
        avas = []
        for attribute, value in rdn:
            if attribute in _OPENSSL_ATTRIBUTES:
                oid, tag = _OPENSSL_ATTRIBUTES[attribute]
            elif _DOTTED_OID.fullmatch(attribute):
                oid, tag = attribute, _UTF8_STRING
            else:
                raise ValueError(f"unknown certificate subject attribute {attribute!r}")
            if tag != _UTF8_STRING and not value.isascii():
                tag = _UTF8_STRING  # neither PrintableString nor IA5String could have held it
            data = value.encode("utf-8")
            avas.append(_ava(oid, tag, _der_tlv(tag, data), data))
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))


def x500_name_from_der(certificate: bytes) -> str:
    """The RFC 2253 DN Java's `X500Principal.getName()` gives for a DER certificate's subject.

    Exact where `x500_name` must guess: the attribute types and string types are read from the
    certificate (`SSLSocket.getpeercert(binary_form=True)`). Raises ValueError if the bytes
    are not a DER X.509 certificate.
    """
    try:
        cert, end = _der_read(certificate, 0)
        if end != len(certificate) or cert.tag != 0x30:
            raise ValueError("not one DER SEQUENCE")
        tbs, _ = _der_read(certificate, cert.start)
        pos = tbs.start
        first, _ = _der_read(certificate, pos)
        # version [0], serialNumber, signature, issuer, validity, subject
        skip = 5 if first.tag == 0xA0 else 4
        for _ in range(skip):
            pos = _der_read(certificate, pos)[1]
        subject, _ = _der_read(certificate, pos)
        if subject.tag != 0x30:
            raise ValueError("subject is not a SEQUENCE")
        return ",".join(reversed(_rdns(certificate, subject)))
    except (IndexError, ValueError) as e:
        raise ValueError(f"not a DER X.509 certificate: {e}") from e


def _rdns(der: bytes, name: _Tlv) -> list[str]:
    rdns = []
    pos = name.start
    while pos < name.end:
        rdn, pos = _der_read(der, pos)
        if rdn.tag != 0x31:
            raise ValueError("RDN is not a SET")
        avas = []
        at = rdn.start
        while at < rdn.end:
            ava, at = _der_read(der, at)
            oid, value_at = _der_read(der, ava.start)
            value, value_end = _der_read(der, value_at)
            if ava.tag != 0x30 or oid.tag != 0x06 or value_end != ava.end:
                raise ValueError("bad AttributeTypeAndValue")
            avas.append(_ava(_oid_text(der[oid.start : oid.end]), value.tag,
                             der[value_at:value_end], der[value.start : value.end]))
        rdns.append("+".join(avas))
    return rdns


def _ava(oid: str, tag: int, encoded: bytes, data: bytes) -> str:
    """One `type=value` the way Java's AVA.toRFC2253String writes it."""
    keyword = _RFC2253_KEYWORDS.get(oid)
    if keyword is None or tag not in _STRING_TAGS:
        return f"{keyword or oid}=#{encoded.hex()}"
    # Java reads every string type's bytes as UTF-8 here (BMPString included), and so do we.
    text = data.decode("utf-8", errors="replace")
    escaped: list[str] = []
    for c in text:
        if c in _ESCAPEES:
            escaped.append("\\" + c)
        elif c == "\0":
            escaped.append("\\00")
        else:
            escaped.append(c)
    chars = "".join(escaped)
    lead = len(chars) - len(chars.lstrip(" \r"))
    trail = len(chars.rstrip(" \r"))
    return f"{keyword}=" + "".join("\\" + c if i < lead or i >= trail else c for i, c in enumerate(chars))


@dataclass(frozen=True, slots=True)
class _Tlv:
    tag: int
    start: int  # first content byte
    end: int  # one past the last content byte


def _der_read(der: bytes, pos: int) -> tuple[_Tlv, int]:
    """The DER element at `pos` and the position after it."""
    tag = der[pos]
    if tag & 0x1F == 0x1F:
        raise ValueError("multi-byte tags do not occur in certificate names")
    length = der[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4:
            raise ValueError("unsupported length encoding")
        length = int.from_bytes(der[pos : pos + count], "big")
        pos += count
    end = pos + length
    if end > len(der):
        raise ValueError("element runs past the end")
    return _Tlv(tag, pos, end), end


def _der_tlv(tag: int, data: bytes) -> bytes:
    n = len(data)
    if n < 0x80:
        return bytes([tag, n]) + data
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + data


def _oid_text(body: bytes) -> str:
    arcs: list[int] = []
    value = 0
    for b in body:
        value = (value << 7) | (b & 0x7F)
        if not b & 0x80:
            arcs.append(value)
            value = 0
    if not arcs or body[-1] & 0x80:
        raise ValueError("bad OBJECT IDENTIFIER")
    first = min(arcs[0] // 40, 2)
    return ".".join(map(str, [first, arcs[0] - 40 * first, *arcs[1:]]))
