"""The security of a local Gazette cluster: TLS certificates made by a
throwaway certificate authority, and the brokers' authorization keys.

``ClusterSecurity.generate(directory)`` writes::

    ca.pem              the CA's certificate: clients trust it (trusted_ca_file)
    broker.pem, .key    the brokers' certificate (for 127.0.0.1 and localhost)
    client.pem, .key    a client certificate, for brokers that ask for one
                        (mutual TLS), signed by the same CA
    auth-keys           the brokers' --broker.auth-keys (two base64 keys)

and ``GazetteCluster(..., security=...)`` starts brokers that serve TLS
(``https://`` endpoints), require client certificates when ``mutual``, and
check authorizations when ``auth_keys`` is set. Needs ``cryptography``
(the test extra).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ClusterSecurity:
    """Files and keys of a secured local cluster (see the module docstring)."""

    ca_file: Path
    server_cert_file: Path
    server_key_file: Path
    client_cert_file: Path
    client_key_file: Path
    #: Brokers ask clients for a certificate signed by the CA.
    mutual: bool = False
    #: The brokers' --broker.auth-keys (None: no authorization checked).
    auth_keys: str | None = None

    @property
    def tls(self) -> bool:
        return True

    def broker_flags(self) -> list[str]:
        """gazette serve's flags for this security."""
        flags = [
            f"--broker.server-cert-file={self.server_cert_file}",
            f"--broker.server-cert-key-file={self.server_key_file}",
            # Brokers call each other (replication): trust the CA, and show
            # the client certificate where brokers ask for one.
            f"--broker.peer-ca-file={self.ca_file}",
            f"--broker.peer-cert-file={self.client_cert_file}",
            f"--broker.peer-cert-key-file={self.client_key_file}",
        ]
        if self.mutual:
            flags.append(f"--broker.server-ca-file={self.ca_file}")
        if self.auth_keys:
            flags.append(f"--broker.auth-keys={self.auth_keys}")
        return flags

    def client_env(self) -> dict[str, str]:
        """The environment gazctl (and GazetteClient) read these from."""
        env = {
            "BROKER_TRUSTED_CA_FILE": str(self.ca_file),
            "BROKER_CERT_FILE": str(self.client_cert_file),
            "BROKER_CERT_KEY_FILE": str(self.client_key_file),
        }
        if self.auth_keys:
            env["BROKER_AUTH_KEYS"] = self.auth_keys
        return env

    def client_options(self) -> dict[str, Any]:
        """``GazetteClient`` keyword arguments for this security."""
        return {
            "trusted_ca_file": str(self.ca_file),
            "cert_file": str(self.client_cert_file),
            "cert_key_file": str(self.client_key_file),
            "auth_keys": self.auth_keys,
        }

    @classmethod
    def generate(
        cls, directory: str | os.PathLike[str], *, mutual: bool = False, auth: bool = True
    ) -> ClusterSecurity:
        """A new CA, broker and client certificates, and (with ``auth``) two
        authorization keys, written under ``directory``."""
        try:
            from cryptography import x509
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec
            from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
        except ImportError as exc:
            raise RuntimeError(
                "a secured local cluster needs the cryptography package (the test extra)"
            ) from exc

        d = Path(directory).resolve()  # brokers run in the cluster's directory
        d.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC)
        valid = (now - dt.timedelta(hours=1), now + dt.timedelta(days=30))

        def name(common: str) -> Any:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

        def write_key(path: Path, key: Any) -> None:
            path.write_bytes(key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption()))
            os.chmod(path, 0o600)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (
            x509.CertificateBuilder()
            .subject_name(name("exactly local cluster CA"))
            .issuer_name(name("exactly local cluster CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0]).not_valid_after(valid[1])
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )

        def leaf(common: str, usages: list[Any]) -> tuple[Any, Any]:
            key = ec.generate_private_key(ec.SECP256R1())
            cert = (
                x509.CertificateBuilder()
                .subject_name(name(common))
                .issuer_name(ca.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(valid[0]).not_valid_after(valid[1])
                .add_extension(x509.SubjectAlternativeName([
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]), critical=False)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .sign(ca_key, hashes.SHA256())
            )
            return cert, key

        server, server_key = leaf("exactly broker", [ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH])
        client, client_key = leaf("exactly client", [ExtendedKeyUsageOID.CLIENT_AUTH])
        pem = serialization.Encoding.PEM
        out = cls(
            ca_file=d / "ca.pem",
            server_cert_file=d / "broker.pem",
            server_key_file=d / "broker.key",
            client_cert_file=d / "client.pem",
            client_key_file=d / "client.key",
            mutual=mutual,
            auth_keys=(
                f"{base64.b64encode(secrets.token_bytes(32)).decode()},"
                f"{base64.b64encode(secrets.token_bytes(32)).decode()}"
            ) if auth else None,
        )
        out.ca_file.write_bytes(ca.public_bytes(pem))
        out.server_cert_file.write_bytes(server.public_bytes(pem))
        write_key(out.server_key_file, server_key)
        out.client_cert_file.write_bytes(client.public_bytes(pem))
        write_key(out.client_key_file, client_key)
        if out.auth_keys:
            (d / "auth-keys").write_text(out.auth_keys + "\n")
            os.chmod(d / "auth-keys", 0o600)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"ca_file": str(self.ca_file), "server_cert_file": str(self.server_cert_file),
                "server_key_file": str(self.server_key_file),
                "client_cert_file": str(self.client_cert_file),
                "client_key_file": str(self.client_key_file), "mutual": self.mutual,
                "auth_keys": self.auth_keys}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ClusterSecurity:
        return cls(ca_file=Path(doc["ca_file"]), server_cert_file=Path(doc["server_cert_file"]),
                   server_key_file=Path(doc["server_key_file"]),
                   client_cert_file=Path(doc["client_cert_file"]),
                   client_key_file=Path(doc["client_key_file"]), mutual=bool(doc["mutual"]),
                   auth_keys=doc.get("auth_keys"))
