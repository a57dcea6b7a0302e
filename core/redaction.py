"""The one redaction policy: what is never shown, wherever a value is shown (console pages and
their websocket pushes, the history JSON export, the audit CSV export, the Django admin).

Keys. A key is split into whole name segments (snake_case, kebab-case, camelCase, dots,
spaces, digits: ``X-Api-Key`` is ``x api key``, ``cardNumber`` is ``card number``,
``cvv2`` is ``cvv 2``). It is secret when its segments contain one of ``SECRET_TERMS``
(a term of several words must appear as consecutive segments) or of the setting
``REDACTION_EXTRA_KEYS``. Matching whole segments is what lets ``prompt_tokens``,
``max_tokens`` (segment ``tokens``), ``company``, ``passenger``, ``pinned``, ``spinner`` and
``authority`` show while ``access_token``, ``pass``, ``pin`` and ``auth`` hide. A few
phrases that only count or describe (``SHOWN_PHRASES``: ``token_usage``, ``token_count``,
``token_type`` ...) are not secret although they contain a term.

Values. ``redact(value)`` returns a copy of a JSON-like value (the input is never mutated):

* a value under a secret key is replaced by ``MARK``, whatever its type (``None`` stays
  ``None``: it tells nothing);
* in a two-item list or tuple whose first item is a secret key name (``["password", "x"]``,
  a header pair ``["Authorization", "Bearer x"]``) the second item is replaced;
* every string goes through ``redact_text``; an int that is a card number is masked;
* containers nested deeper than ``MAX_DEPTH`` are replaced by ``TOO_DEEP`` (so no
  ``RecursionError``, whatever the input).

``redact_text(text)`` masks inside free text: ``Bearer``/``Basic`` credentials, the value of
``key=value``, ``key: value`` and ``"key": "value"`` pairs whose key is secret (the same key
policy), ``"key", "value"`` pairs of quoted strings, the password of ``scheme://user:pass@``
URLs, JWTs (``eyJ…`` in three base64url parts), card numbers (13 to 19 digits, bare or in
groups split by one kind of space or dash, first digit 2 to 6 (the banking and financial
industry identifiers), passing the Luhn check: shown as ``•••• 4242``) and IBANs passing
their mod-97 check (``•••• 3000``).

Not guaranteed: a secret in a form no rule describes (a bare password in prose, the second
word of an unquoted value with spaces) is shown. Keys themselves are shown as they are.
Numbers that pass the card rules are masked even when they are something else (one in ten
13 to 19 digit numbers starting with 2 to 6 passes Luhn).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

MARK = "•••• redacted"
TOO_DEEP = "•••• nested too deep to show"
MAX_DEPTH = 50  # containers below this many levels are replaced by TOO_DEEP
MAX_KEY_CHARS = 200  # longer strings are text, not key names

# Each term is one segment or several consecutive ones (written with spaces).
SECRET_TERMS: tuple[str, ...] = (
    # passwords
    "password", "passwd", "pwd", "pass", "passphrase", "passcode",
    # secrets and tokens
    "secret", "secrets", "client secret", "clientsecret", "token", "accesstoken", "refreshtoken", "idtoken",
    "authtoken", "csrftoken", "xsrf", "jwt", "otp",
    "api key", "apikey", "private key", "privatekey", "credential", "credentials", "creds",
    # HTTP authentication and sessions
    "authorization", "auth", "bearer", "cookie", "cookies", "setcookie", "session", "sessionid",
    # Webhook signatures authenticate a request and replay with it; an operator needs only
    # to know whether it was valid.
    "signature",
    # payment cards, bank accounts, identity numbers
    "card number", "cardnumber", "card no", "cc number", "ccnumber", "cc num", "pan", "cvv", "cvc", "cvn",
    "iban", "ssn", "pin",
)
# Phrases that contain a term but only count or describe (LLM usage, OAuth's token_type).
SHOWN_PHRASES: tuple[str, ...] = (
    "token usage", "token count", "token counts", "token limit", "token budget", "token type",
    "auth type", "auth method", "auth scheme",
)

_SEGMENT = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_KEY_LIKE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


def segments(key: str) -> tuple[str, ...]:
    """``"X-Api-Key"`` -> ``("x", "api", "key")``; ``"sessionId"`` -> ``("session", "id")``."""
    return tuple(s.lower() for s in _SEGMENT.findall(key))


def _contains(haystack: tuple[str, ...], phrase: tuple[str, ...]) -> list[int]:
    n = len(phrase)
    return [i for i in range(len(haystack) - n + 1) if haystack[i:i + n] == phrase]


class KeyPolicy:
    """Which key names are secret: ``SECRET_TERMS`` plus ``extra`` phrases. Memoises answers."""

    CACHE_LIMIT = 50_000

    def __init__(self, extra: Iterable[str] = ()) -> None:
        phrases = [segments(t) for t in (*SECRET_TERMS, *extra)]
        self.single = frozenset(p[0] for p in phrases if len(p) == 1)
        self.multi = tuple(p for p in phrases if len(p) > 1)
        self.shown = tuple(segments(p) for p in SHOWN_PHRASES)
        self.cache: dict[str, bool] = {}

    def is_secret(self, key: str) -> bool:
        hit = self.cache.get(key)
        if hit is None:
            hit = self.decide(key)
            if len(self.cache) < self.CACHE_LIMIT:
                self.cache[key] = hit
        return hit

    def decide(self, key: str) -> bool:
        if len(key) > MAX_KEY_CHARS:
            return False
        segs = segments(key)
        shown: set[int] = set()
        for phrase in self.shown:
            for i in _contains(segs, phrase):
                shown.update(range(i, i + len(phrase)))
        if any(s in self.single and i not in shown for i, s in enumerate(segs)):
            return True
        return any(set(range(i, i + len(p))) - shown for p in self.multi for i in _contains(segs, p))


@functools.lru_cache(maxsize=8)
def _policy_for(extra: tuple[str, ...]) -> KeyPolicy:
    for phrase in extra:
        if not isinstance(phrase, str) or not segments(phrase):
            raise ImproperlyConfigured(f"REDACTION_EXTRA_KEYS: {phrase!r} is not a key name")
    return KeyPolicy(extra)


def current_policy() -> KeyPolicy:
    """The policy for the current settings (``REDACTION_EXTRA_KEYS`` may change in tests)."""
    extra = getattr(settings, "REDACTION_EXTRA_KEYS", ())
    if isinstance(extra, str) or not isinstance(extra, (list, tuple)):
        raise ImproperlyConfigured("REDACTION_EXTRA_KEYS must be a list of key names")
    return _policy_for(tuple(extra))


def is_secret_key(key: object) -> bool:
    return isinstance(key, str) and current_policy().is_secret(key)


# --- values inside text ------------------------------------------------------------------------

_QUOTED = r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'"""
_TEXT = re.compile(
    rf"""
    (?P<url>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)(?P<urlpw>[^\s/@]+)(?=@)
  | (?P<scheme>\b(?i:bearer|basic)\s+)(?P<cred>[A-Za-z0-9._~+/=-]{{8,}})
  | (?P<jwt>\beyJ[A-Za-z0-9_-]{{8,}}\.[A-Za-z0-9_-]{{8,}}\.[A-Za-z0-9_-]*)
  | (?P<iban>(?<![A-Za-z0-9])[A-Z]{{2}}[0-9]{{2}}(?:\ ?[A-Z0-9]){{11,30}}(?![A-Za-z0-9]))
  | (?P<card>(?<![A-Za-z0-9])(?:[2-6][0-9]{{12,18}}
        |[2-6][0-9]{{3}}(?P<sep>[ -])[0-9]{{4,6}}(?:(?P=sep)[0-9]{{1,5}}){{1,3}})
        (?![A-Za-z0-9]))
  | (?P<kq>["']?)(?P<key>\b[A-Za-z_][A-Za-z0-9_.-]*)(?P=kq)
        (?:
          (?P<is>\s*[:=]\s*)(?=(?P<val>{_QUOTED}|(?:(?i:bearer|basic|digest|token)\s+)?[^\s,;&"'<>(){{}}\[\]]+))
        | (?P<comma>(?<=["'])\s*,\s*)(?=(?P<pval>{_QUOTED}))
        )
    """,
    re.VERBOSE,
)


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _iban_ok(text: str) -> bool:
    compact = text.replace(" ", "")
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in moved)) % 97 == 1


def _masked_value(quoted: str) -> str:
    return quoted[0] + MARK + quoted[0] if quoted[:1] in ("'", '"') else MARK


_DIGITS = re.compile(r"[0-9]{4}")


def _may_hold_secret(text: str) -> bool:
    """A cheap test that rules out most short strings before the full scan."""
    if ":" in text or "=" in text or "eyJ" in text or ("," in text and ('"' in text or "'" in text)):
        return True
    if len(text) >= 13 and _DIGITS.search(text):
        return True
    low = text.lower()
    return "bearer" in low or "basic" in low


def _redact_text(text: str, policy: KeyPolicy) -> str:
    match = _TEXT.search(text) if _may_hold_secret(text) else None
    if match is None:
        return text
    out: list[str] = []
    pos = 0
    while match is not None:
        out.append(text[pos:match.start()])
        pos = match.end()
        if match.group("url") is not None:
            out.append(match.group("url") + MARK)
        elif match.group("scheme") is not None:
            out.append(match.group("scheme") + MARK)
        elif match.group("jwt") is not None:
            out.append(MARK)
        elif match.group("iban") is not None:
            found = match.group("iban")
            out.append("•••• " + found.replace(" ", "")[-4:] if _iban_ok(found) else found)
        elif match.group("card") is not None:
            found = match.group("card")
            digits = found.replace(" ", "").replace("-", "")
            out.append("•••• " + digits[-4:] if 13 <= len(digits) <= 19 and _luhn(digits) else found)
        else:  # a key followed by ":", "=" or (quoted) ","
            out.append(match.group(0))
            value = match.group("val") if match.group("is") is not None else match.group("pval")
            if policy.is_secret(match.group("key")):
                out.append(_masked_value(value))
                pos += len(value)
            # otherwise the value is scanned like any text
        match = _TEXT.search(text, pos)
    out.append(text[pos:])
    return "".join(out)


def redact_text(text: str) -> str:
    """``text`` with the secrets the module docstring lists masked."""
    return _redact_text(text, current_policy())


# --- structured values -------------------------------------------------------------------------


def _mask_int(number: int) -> int | str:
    if 10**12 <= number < 10**19:
        digits = str(number)
        if digits[0] in "23456" and _luhn(digits):
            return "•••• " + digits[-4:]
    return number


_PLAIN = (bool, float, type(None))


def _redact(value: Any, policy: KeyPolicy, depth: int) -> Any:
    kind = type(value)
    if kind is str:
        return _redact_text(value, policy)
    if kind in _PLAIN:
        return value
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        secret = policy.is_secret
        depth += 1
        return {
            k: (MARK if v is not None and isinstance(k, str) and secret(k) else _redact(v, policy, depth))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        first = value[0] if len(value) == 2 else None
        if isinstance(first, str) and _KEY_LIKE.match(first) and policy.is_secret(first):
            items = [first, None if value[1] is None else MARK]
        else:
            depth += 1
            items = [_redact(v, policy, depth) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, str):  # a str subclass
        return _redact_text(str(value), policy)
    if isinstance(value, int) and not isinstance(value, bool):
        return _mask_int(value)
    return value


def redact(value: Any) -> Any:
    """A redacted copy of ``value`` (see the module docstring). Never mutates ``value``."""
    return _redact(value, current_policy(), 0)


def redact_json(value: Any) -> str:
    """``value`` redacted, as indented JSON text with sorted keys: how the console's pages and the
    admin show a payload. A plain string, for the template to escape."""
    return json.dumps(redact(value), indent=2, sort_keys=True, ensure_ascii=False, default=str)
