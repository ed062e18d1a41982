"""TLS contexts for client listeners and broker connections, reloaded when their files change.

An SSLContext is mutable: loading a new certificate chain into the context a server already
uses makes every new handshake present it, while established connections keep theirs. So a
reload needs no new listener and drops no connection. CA bundles only ever add trust on reload
(OpenSSL's store has no removal); removing a CA takes a restart.
"""

from __future__ import annotations

import logging
import ssl

from kafka_quota_proxy.config.identity_settings import TlsSettings, UpstreamTlsSettings
from kafka_quota_proxy.proxy.file_watch import watch_files

log = logging.getLogger("kafka_quota_proxy.tls")

VERIFY = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def server_context(s: TlsSettings) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(s.cert_file, s.key_file)
    if s.ca_file:
        ctx.load_verify_locations(s.ca_file)
    ctx.verify_mode = VERIFY[s.client_auth]
    return ctx


def upstream_context(s: UpstreamTlsSettings) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=s.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = s.check_hostname
    if s.cert_file and s.key_file:
        ctx.load_cert_chain(s.cert_file, s.key_file)
    return ctx


async def watch_certificates(ctx: ssl.SSLContext, cert: str | None, key: str | None, ca: str | None,
                             what: str, poll_seconds: float = 2.0) -> None:
    """Reload `ctx`'s certificate (and CA) when the files change; a bad file keeps the old one."""
    def reload() -> None:
        try:
            if cert and key:
                ctx.load_cert_chain(cert, key)
            if ca:
                ctx.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as exc:
            log.error("%s certificate reload failed, keeping the current one: %s", what, exc)
            return
        log.info("%s certificate reloaded from %s", what, cert or ca)

    await watch_files([p for p in (cert, key, ca) if p], poll_seconds, reload)
