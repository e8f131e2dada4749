"""How a ``GazetteClient`` checks the brokers and proves itself to them:
the CA it trusts, its client certificate (mutual TLS) and the
authorizations it signs, from its arguments or, left out, from the
environment as ``gazctl`` reads them (``BROKER_TRUSTED_CA_FILE``,
``BROKER_CERT_FILE``, ``BROKER_CERT_KEY_FILE``, ``BROKER_AUTH_KEYS``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

from .auth import KeyedAuth


@dataclass(frozen=True, slots=True)
class Security:
    """How a client checks the brokers and proves itself to them: the PEM
    bytes of the CA it trusts (None: the system's) and of its own
    certificate and key (mutual TLS), and the authorizations it signs."""

    trusted_ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    auth: KeyedAuth | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.trusted_ca, private_key=self.key, certificate_chain=self.cert
        )


def security_of(
    trusted_ca_file: str | os.PathLike[str] | None,
    cert_file: str | os.PathLike[str] | None,
    cert_key_file: str | os.PathLike[str] | None,
    auth_keys: str | None,
    auth_token_ttl: float,
) -> Security:
    """The client's TLS files and authorizations, each from its argument or,
    left out (None), from the environment as ``gazctl`` reads it. An empty
    argument means none, whatever the environment says (as an empty
    ``--cert-file`` does for ``gazctl``)."""
    env = os.environ

    def read(what: str, path: str | os.PathLike[str] | None, var: str) -> bytes | None:
        path = path if path is not None else env.get(var)
        if path is None or not os.fspath(path):
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise ValueError(f"{what} {os.fspath(path)!r}: {exc.strerror or exc}") from None

    cert = read("cert_file", cert_file, "BROKER_CERT_FILE")
    key = read("cert_key_file", cert_key_file, "BROKER_CERT_KEY_FILE")
    if (cert is None) != (key is None):
        raise ValueError("give cert_file and cert_key_file together (a client certificate"
                         " and its key), or neither")
    keys = auth_keys if auth_keys is not None else env.get("BROKER_AUTH_KEYS") or None
    return Security(
        trusted_ca=read("trusted_ca_file", trusted_ca_file, "BROKER_TRUSTED_CA_FILE"),
        cert=cert,
        key=key,
        auth=KeyedAuth(keys, ttl=auth_token_ttl) if keys else None,
    )
