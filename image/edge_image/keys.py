"""Update signing keys for RAUC bundles.

A fleet's keyring is a CA certificate (``/etc/rauc/keyring.pem`` in the image); bundles
are signed with a key whose certificate that CA issued. Release keys never live in the
repository: pass ``--signing-key/--signing-cert/--keyring`` (or the EDGE_GATEWAY_SIGNING_*
variables). Without them a *development* CA and signing key are generated once into the
cache (``<cache>/keys/dev``) and reused, so every dev build of one host trusts the same key;
``--release`` refuses to fall back to them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edge_image.common import BadInput, run


@dataclass(frozen=True)
class SigningKeys:
    key: Path
    cert: Path
    keyring: Path
    development: bool


def make_ca_and_signer(dest: Path, name: str) -> SigningKeys:
    """A self-signed CA and a signing certificate it issued, under ``dest`` (mode 0700)."""
    dest.mkdir(parents=True, exist_ok=True)
    os.chmod(dest, 0o700)
    ca_key, ca_cert = dest / "ca.key.pem", dest / "ca.cert.pem"
    key, csr, cert = dest / "signing.key.pem", dest / "signing.csr", dest / "signing.cert.pem"
    ext = dest / "signing.ext"
    ext.write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   "extendedKeyUsage=codeSigning\nsubjectKeyIdentifier=hash\n"
                   "authorityKeyIdentifier=keyid\n")
    run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", ca_key, "-out", ca_cert, "-days", "3650",
         "-subj", f"/O=Edge gateway/CN={name} update CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", key, "-out", csr, "-subj", f"/O=Edge gateway/CN={name} update signing"])
    run(["openssl", "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
         "-CAcreateserial", "-out", cert, "-days", "3650", "-extfile", ext])
    for f in dest.iterdir():
        os.chmod(f, 0o600)
    return SigningKeys(key, cert, ca_cert, development=True)


def resolve(key: str | None, cert: str | None, keyring: str | None, *, release: bool,
            cache: Path) -> SigningKeys:
    key = key or os.environ.get("EDGE_GATEWAY_SIGNING_KEY")
    cert = cert or os.environ.get("EDGE_GATEWAY_SIGNING_CERT")
    keyring = keyring or os.environ.get("EDGE_GATEWAY_KEYRING")
    given = [v for v in (key, cert, keyring) if v]
    if given and len(given) != 3:
        raise BadInput("--signing-key, --signing-cert and --keyring go together "
                       "(docs/image.md#signing-keys)")
    if key and cert and keyring:
        for label, p in (("signing key", key), ("signing certificate", cert),
                         ("keyring", keyring)):
            if not Path(p).is_file():
                raise BadInput(f"{label} {p} does not exist")
        return SigningKeys(Path(key).resolve(), Path(cert).resolve(), Path(keyring).resolve(),
                           development=False)
    if release:
        raise BadInput("no signing key: a --release build needs --signing-key, "
                       "--signing-cert and --keyring (docs/image.md#signing-keys)")
    dev = cache / "keys" / "dev"
    if (dev / "signing.cert.pem").exists() and (dev / "ca.cert.pem").exists():
        return SigningKeys(dev / "signing.key.pem", dev / "signing.cert.pem",
                           dev / "ca.cert.pem", development=True)
    tmp = dev.with_name("dev.tmp")
    run(["rm", "-rf", tmp])
    make_ca_and_signer(tmp, "Development")
    tmp.rename(dev)
    return SigningKeys(dev / "signing.key.pem", dev / "signing.cert.pem",
                       dev / "ca.cert.pem", development=True)
