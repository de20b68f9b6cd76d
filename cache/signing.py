"""Signed exports: who made a file, not only whether it is intact (the checksum's job).

A signature covers an export's checksum, which covers its canonical payload, so no row of a signed
file can change without breaking it. Two kinds of key:
  * HMAC-SHA256 (standard library): a shared secret of at least 16 bytes, from
    $AUTOTUNE_SIGNING_KEY (text) or a key file; whoever verifies can also sign.
  * Ed25519 (the `cryptography` package, extra `sign`): a PEM private key signs, its PEM public key
    (or the private key) verifies; a serving image needs only the public key.
A key file ($AUTOTUNE_SIGNING_KEY_FILE or an explicit path) holding a PEM block is an Ed25519 key,
anything else is an HMAC secret (surrounding whitespace stripped). No key configured: exports are
unsigned and imports do not check signatures, and both say so.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from autotune.core import settings
from autotune.cache.files import CacheError

KEY_ENV = settings.SIGNING_KEY
KEY_FILE_ENV = settings.SIGNING_KEY_FILE
HMAC_SHA256 = "hmac-sha256"
ED25519 = "ed25519"
MIN_SECRET = 16
_MAX_KEY_FILE = 64 << 10
_DOMAIN = b"fp4-autotune-cache signature v1\n"    # a signature over anything else never verifies here


def _message(checksum: str) -> bytes:
    return _DOMAIN + checksum.encode()


@dataclass(frozen=True)
class SigningKey:
    """A loaded key. `sign` needs an HMAC secret or an Ed25519 private key."""

    alg: str
    key_id: str                       # 16 hex digits naming the key, safe to print
    source: str
    _secret: bytes | None = field(default=None, repr=False)
    _private: Any = field(default=None, repr=False)
    _public: Any = field(default=None, repr=False)

    @property
    def can_sign(self) -> bool:
        return self._secret is not None or self._private is not None

    def describe(self) -> str:
        return f"{self.alg}, key {self.key_id}"

    def sign(self, checksum: str) -> dict:
        if self._secret is not None:
            sig = hmac.new(self._secret, _message(checksum), hashlib.sha256).hexdigest()
        elif self._private is not None:
            sig = self._private.sign(_message(checksum)).hex()
        else:
            raise CacheError(f"{self.source} is an Ed25519 public key: signing needs the private key")
        return {"alg": self.alg, "key_id": self.key_id, "sig": sig}

    def check(self, signature: Any, checksum: str) -> str | None:
        """Why `signature` is not this key's signature of `checksum` (None: it is)."""
        if not isinstance(signature, Mapping) or not all(isinstance(signature.get(k), str)
                                                         for k in ("alg", "key_id", "sig")):
            return "malformed signature"
        if signature["alg"] != self.alg:
            return f"signed with {signature['alg']}, the configured key is {self.alg}"
        if signature["key_id"] != self.key_id:
            return f"signed by key {signature['key_id']}, the configured key is {self.key_id}"
        try:
            raw = bytes.fromhex(signature["sig"])
        except ValueError:
            return "malformed signature"
        if self._secret is not None:
            good = hmac.compare_digest(raw, hmac.new(self._secret, _message(checksum), hashlib.sha256).digest())
        else:
            from cryptography.exceptions import InvalidSignature
            try:
                self._public.verify(raw, _message(checksum))
                good = True
            except InvalidSignature:
                good = False
        return None if good else "signature does not match the contents"


def _hmac_key(secret: bytes, source: str) -> SigningKey:
    if len(secret) < MIN_SECRET:
        raise CacheError(f"signing key from {source} is too short ({len(secret)} bytes, need {MIN_SECRET})")
    kid = hashlib.sha256(b"fp4-autotune hmac key id\n" + secret).hexdigest()[:16]
    return SigningKey(HMAC_SHA256, kid, source, _secret=secret)


def _ed25519_key(pem: bytes, source: str) -> SigningKey:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    except ImportError:
        raise CacheError(f"{source} is a PEM key: Ed25519 needs the cryptography package "
                         "(pip install 'fp4-autotune[sign]')") from None
    private = None
    try:
        if b"PRIVATE KEY" in pem:
            private = serialization.load_pem_private_key(pem, password=None)
            public = private.public_key()
        else:
            public = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as e:
        raise CacheError(f"cannot load the key in {source}: {str(e).splitlines()[0] if str(e) else e}") from None
    if not isinstance(public, Ed25519PublicKey) or (private is not None and not isinstance(private, Ed25519PrivateKey)):
        raise CacheError(f"{source} is not an Ed25519 key (exports are signed with Ed25519 or HMAC-SHA256)")
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey(ED25519, hashlib.sha256(raw).hexdigest()[:16], source, _private=private, _public=public)


def key_from_file(path: str | os.PathLike) -> SigningKey:
    p = os.path.expanduser(os.fspath(path))
    try:
        with open(p, "rb") as f:
            data = f.read(_MAX_KEY_FILE + 1)
    except OSError as e:
        raise CacheError(f"cannot read signing key {p}: {e.strerror or e}") from None
    if len(data) > _MAX_KEY_FILE:
        raise CacheError(f"signing key {p} is larger than {_MAX_KEY_FILE} bytes: not a key")
    data = data.strip()
    return _ed25519_key(data, p) if data.startswith(b"-----BEGIN") else _hmac_key(data, p)


def load_key(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """The configured key: `path`, else $AUTOTUNE_SIGNING_KEY_FILE, else $AUTOTUNE_SIGNING_KEY
    (an HMAC secret as text), else None (unsigned)."""
    env = os.environ if environ is None else environ
    if path is not None:
        return key_from_file(path)
    if env.get(KEY_FILE_ENV, "").strip():
        return key_from_file(env[KEY_FILE_ENV].strip())
    secret = env.get(KEY_ENV, "")
    if secret.strip():
        return _hmac_key(secret.strip().encode(), f"${KEY_ENV}")
    return None


def describe(signature: Any) -> str:
    """A signature as a reader sees it without a key."""
    if signature is None:
        return "unsigned"
    if isinstance(signature, Mapping):
        return f"signed ({signature.get('alg')}, key {signature.get('key_id')})"
    return "signed (malformed signature)"
