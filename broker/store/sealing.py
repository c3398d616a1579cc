"""Secrets the database keeps (jobs' `secrets`, budgets' notification
targets) are sealed: AES-256-GCM under a key the database never holds.

A sealed value is one string that names the key it was sealed with:

    sbenc:v1:{key id}:{nonce + ciphertext + tag, base64url}

The key id is a fingerprint of the key (never the key), so a broker knows
which of its keys opens a value, and `spotbroker db reseal` knows which
values still need the current key. Each value is bound to where it belongs
(its `context`: the team and the secret's name), so a ciphertext copied
into another team's row does not open there.

The keys: `SPOTBROKER_ENCRYPTION_KEYS` (comma-separated; the first seals,
every one opens), and always, last, a key derived from the broker's signing
key (`SPOTBROKER_SECRET_KEY` or the data directory's `secret_key` file) with
HKDF under a label of its own, so the signing key itself never encrypts.
Rotation is in docs/security.md.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

if TYPE_CHECKING:
    from spotbroker.broker.settings import Settings

PREFIX = "sbenc:v1:"
_LABEL = b"spotbroker at-rest encryption v1"
_NONCE_BYTES = 12


class SealError(ValueError):
    """A sealed value that cannot be opened, and why (never the value)."""


def derive(material: bytes) -> bytes:
    """The AES-256 key for some key material (a configured key, or the
    signing key): HKDF-SHA256 under a label no other use of it shares."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL).derive(material)


def key_id(key: bytes) -> str:
    """A public fingerprint of a key: which key sealed a value, without the key."""
    return hmac.new(key, b"spotbroker key id", hashlib.sha256).hexdigest()[:12]


def sealed_key_id(value: str) -> str | None:
    """The id of the key a sealed value names, or None when it is not one."""
    if not isinstance(value, str) or not value.startswith(PREFIX):
        return None
    kid, sep, _ = value[len(PREFIX):].partition(":")
    return kid if sep else None


class Keyring:
    """AES-256 keys: the first seals, every one opens."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a keyring needs a key")
        self._keys = {key_id(k): AESGCM(k) for k in keys}
        self.current = key_id(keys[0])

    @classmethod
    def from_material(cls, materials: Sequence[bytes]) -> Keyring:
        return cls([derive(m) for m in materials])

    def seal(self, plaintext: str, context: str) -> str:
        nonce = os.urandom(_NONCE_BYTES)
        body = self._keys[self.current].encrypt(nonce, plaintext.encode(), _aad(self.current, context))
        return f"{PREFIX}{self.current}:{base64.urlsafe_b64encode(nonce + body).decode().rstrip('=')}"

    def open(self, sealed: str, context: str) -> str:
        kid = sealed_key_id(sealed)
        if kid is None:
            raise SealError("not a sealed value")
        aead = self._keys.get(kid)
        if aead is None:
            raise SealError(f"sealed with key {kid}, which this broker does not have "
                            "(SPOTBROKER_ENCRYPTION_KEYS must list the key that sealed it)")
        data = sealed[len(PREFIX) + len(kid) + 1:]
        try:
            raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
            return aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _aad(kid, context)).decode()
        except (ValueError, InvalidTag, UnicodeDecodeError):
            raise SealError(f"sealed with key {kid} but does not open: altered, or copied from elsewhere") from None

    def is_current(self, sealed: str) -> bool:
        return sealed_key_id(sealed) == self.current


def _aad(kid: str, context: str) -> bytes:
    # The key id and the context are authenticated: neither can be swapped.
    return f"{PREFIX}{kid}|{context}".encode()


def keyring(settings: Settings) -> Keyring:
    """The broker's keyring: the configured keys in order, then the key
    derived from the signing key (which seals when none is configured)."""
    configured = [k.strip().encode() for k in settings.encryption_key_list()]
    return Keyring.from_material([*configured, settings.signing_key()])
