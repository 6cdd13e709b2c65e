"""Request keys: the 64-bit identity a request's draws are keyed by.

A key comes from what a request is (its prompt tokens and sampling parameters), or from the
caller (a str, hashed, or an unsigned 64-bit int), never from when or where it ran.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Iterable
from functools import lru_cache

from randkv.spec.draws import MASK64


@lru_cache(maxsize=1024)
def _digest64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def request_key_from_text(text: str) -> int:
    """A 64-bit request key from a caller-chosen string (blake2b-64 of its UTF-8 bytes)."""
    return _digest64(b"randkv-key:" + text.encode("utf-8"))


#: What callers may pass as a request key: an unsigned 64-bit int, or a str (hashed).
RequestKey = int | str


def coerce_request_key(value: object) -> int:
    """The 64-bit request key for what a caller passed.

    An int in [0, 2**64 - 1] is the key itself; a str is `request_key_from_text(value)`.
    Anything else (float, bool, bytes, a sequence, an out-of-range int) is refused with an
    error that names the accepted types.
    """
    if isinstance(value, str):
        return request_key_from_text(value)
    # numbers.Integral admits numpy integers; bool is an int subclass but never a key.
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        key = int(value)
        if not 0 <= key <= MASK64:
            raise ValueError(
                f"request key {key} is out of range: a request key must be an int in "
                "[0, 2**64 - 1] (unsigned 64-bit) or a str (hashed by request_key_from_text)"
            )
        return key
    raise TypeError(
        "a request key must be an int in [0, 2**64 - 1] or a str (hashed by "
        f"request_key_from_text); got {type(value).__name__} {value!r}"
    )


def request_key_from_content(
    prompt_token_ids: Iterable[int], sampling_fingerprint: str = "", user_key: str | None = None
) -> int:
    """A 64-bit request key from what a request is, not when or where it ran.

    The prompt token ids, a canonical string of the sampling parameters, and an optional
    caller-supplied key. Identical requests therefore make identical decisions.
    """
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(b"randkv-content:")
    for token in prompt_token_ids:
        hasher.update(int(token).to_bytes(8, "little", signed=True))
    hasher.update(b"|sampling:" + sampling_fingerprint.encode("utf-8"))
    if user_key is not None:
        hasher.update(b"|user:" + user_key.encode("utf-8"))
    return int.from_bytes(hasher.digest(), "little")
