"""Test certificates from one trustme CA: a server certificate for the proxy's loopback listener
and client certificates with a chosen subject for mTLS principals."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography import x509


@dataclass(frozen=True, slots=True)
class CertFiles:
    """A certificate (PEM, leaf first) and its private key on disk, and the leaf's serial number."""

    cert: Path
    key: Path
    serial: int


class Pki:
    """A test CA that writes its certificates under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA(organization_name="kafka-quota-proxy tests")
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def _write(self, leaf: trustme.LeafCert, cert: Path, key: Path) -> CertFiles:
        # The key first: a reader that sees the new certificate then also finds its key.
        leaf.private_key_pem.write_to_path(str(key))
        chain = b"".join(pem.bytes() for pem in leaf.cert_chain_pems)
        cert.write_bytes(chain)
        serial = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number
        return CertFiles(cert, key, serial)

    def server(self, name: str = "server") -> CertFiles:
        """A server certificate for 127.0.0.1 (an IP SAN) and localhost, in `<name>.pem`."""
        return self._write(self.ca.issue_cert("127.0.0.1", "localhost"),
                           self.directory / f"{name}.pem", self.directory / f"{name}-key.pem")

    def reissue(self, files: CertFiles) -> CertFiles:
        """Overwrite a server certificate's files in place with a newly issued one."""
        return self._write(self.ca.issue_cert("127.0.0.1", "localhost"), files.cert, files.key)

    def client(self, common_name: str, organization: str = "Example") -> CertFiles:
        """A client certificate whose subject is CN=<common_name>,OU=Clients,O=<organization>
        (trustme always adds an OU)."""
        leaf = self.ca.issue_cert(common_name=common_name, organization_name=organization,
                                  organization_unit_name="Clients")
        stem = f"client-{common_name}"
        return self._write(leaf, self.directory / f"{stem}.pem", self.directory / f"{stem}-key.pem")
