"""What a secret looks like: the one table of credential shapes the content policy masks.

Each :class:`SecretShape` names a shape, shows an example and what is left of it, and
says how it is found: by a regular expression (one of :data:`DEFAULT_PATTERNS`) or by
the key-value rule (:data:`KEY_VALUE`: the value after a key that names a secret, an
``Authorization`` or ``Cookie`` header, a signed URL's ``key=``/``sig=`` parameter).

Only the secret is masked, not what says what it is: ``Authorization: Basic [REDACTED]``,
``postgres://[REDACTED]@db:5432``. A pattern marks the part it masks with a group named
``secret`` (a pattern without one is masked whole); user patterns may do the same.

The local store runs these expressions only on the values an RE2 prefilter picks
(:mod:`loopscope.storage.scrub`): each shape's ``prefilter`` must match wherever its
pattern does (tests/export/test_secret_patterns.py checks every example). The
expressions here avoid ``\\w``, ``\\b`` and Unicode case folding where a prefilter
depends on them, and none scans back over a run of characters (no quadratic cases).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REDACTED = "[REDACTED]"


@dataclass(frozen=True)
class SecretShape:
    """One credential shape: how it looks, what is left of it, how it is found."""

    name: str
    example: str
    masked: str
    pattern: str | None = None
    """The Python expression (None: found by the key-value rule)."""
    prefilter: str | None = None
    """An RE2 expression (case-insensitive unless it says ``(?-i:``) matching wherever
    ``pattern`` does: the store's writer looks at no other value."""
    literals: tuple[str, ...] = ()
    """Lowercase strings one of which is in the lowercased text wherever ``pattern``
    matches: Python runs no expression on text with none of them (export's fast path)."""



# Words a key ends with when its value is a secret (``aws_secret_access_key``,
# ``X-Amz-Signature``, ``AccountKey``, ``client_secret``...). Written so that Python and
# RE2 read it alike. Not ``key``, ``sig`` or ``signature`` alone (prose, ``sort_key``, the
# signature of a model's thinking block): those only as URL query parameters. ``token``
# but not ``tokens`` (``max_tokens=5``), and a token's value must look like a credential
# (see :func:`_credible_token`).
SECRET_KEY_WORDS = (
    r"passw(?:or)?d|passphrase|pwd|secret"
    r"|(?:api|access|account|private|secret|signing|subscription|master|client|encryption|shared)[_-]?key"
    r"|(?:amz|goog|access|url|request)[_-]?signature|token|credentials?|authorization|cookie"
)

_AUTH_SCHEMES = (
    r"basic|bearer|digest|token|negotiate|ntlm|aws4-hmac-sha256|hoba|mutual|vapid|scram-sha-1|scram-sha-256"
    r"|dpop|gnap|oauth|bot|apikey|key|sharedkey(?:lite)?|sso-key"
)

KEY_VALUE = re.compile(
    rf"""
    (?P<key>
        (?:(?P<auth>authorization)|(?P<cookie>cookie)|(?P<token>token)|{SECRET_KEY_WORDS})(?:\\*["'])?\s*[:=]\s*
      | [?&](?:key|sig|signature)=                        # signed URLs: ?key=..., &sig=...
    )
    (?!\s|\[REDACTED\])                                  # (not the key's spaces given back)
    (?P<value>
        "(?:[^"\\]|\\.)*"                                  # a quoted value, whole
      | \\+"(?:[^"\\]|\\+[^"\\])*\\+"                # quoted inside a JSON string (\"...\", \\\"...\\\")
      | '[^'\n]*'
      | (?(cookie)(?:=[ \t]*"[^"\\\r\n]*"|=[ \t]*\\+"[^"\\\r\n]*\\+"|[^\r\n\\"]|\\+[^rn"\\])+
                                                           # a Cookie header: to the end of its line (or of
                                                           # its string: "..." only as a cookie's value)
      | (?(auth)(?:(?:{_AUTH_SCHEMES})[ \t]+)?[^\s,;"'\\]+  # Authorization: the scheme and its credential
      | (?:[^\s,;&}}\]\\]|\\+[^"\\nrt])+))                 # anything else: up to a separator, a \" or
    )                                                      # an escaped line end or tab (\n \r \t in JSON text)
    """,
    re.ASCII | re.IGNORECASE | re.VERBOSE,
)
"""The key-value rule (``ContentPolicy(key_values=True)``, the default)."""

KEY_VALUE_PREFILTER = r"(?:pass[a-z]*|pwd|secret|key|signature|token|credentials?|authorization|cookie)\\*[\"']?[\s\v]*[:=]|[?&]sig="
"""RE2, case-insensitive: matches wherever :data:`KEY_VALUE` does (its key part, or a
shorter superset of it: an RE2 expression's cost in Arrow is mostly its compilation)."""

KEY_VALUE_LITERALS = ("pass", "pwd", "secret", "key", "token", "signature", "credential", "authorization", "cookie", "sig=")
"""Lowercase: one of them is in the lowercased text wherever :data:`KEY_VALUE` matches."""

SECRET_KEY = re.compile(rf"[A-Za-z0-9_.\-]*(?:(?P<auth>authorization)|(?P<cookie>cookie)|(?P<token>token)|{SECRET_KEY_WORDS})",
                        re.ASCII | re.IGNORECASE)
"""A JSON key whose value is masked (fullmatch): the keys of :data:`KEY_VALUE`."""

_SCHEME = re.compile(rf"(?P<scheme>(?:{_AUTH_SCHEMES})[ \t]+)(?P<rest>.*)", re.ASCII | re.IGNORECASE | re.DOTALL)


_ESCAPED_QUOTE = re.compile(r'\\+"')


def _credible_token(value: str) -> bool:
    """Whether a ``token`` key's value may be a credential: not a model's token (a word,
    ``{"token": "Hello", "logprob": -0.1}``) nor a count. Credentials are long."""
    return len(value) >= 8 and not any(c.isspace() for c in value)


def mask_secret_value(kind: str | None, value: str) -> str | None:
    """``value`` (unquoted) of a secret-named key, masked; None to leave it as it is.

    ``kind`` is ``"auth"`` (the scheme is kept), ``"token"`` (masked only when credible),
    or anything else (masked whole)."""
    if value.startswith(REDACTED):
        return None
    if kind == "auth":
        scheme = _SCHEME.fullmatch(value)
        if scheme is not None:
            return None if scheme["rest"].startswith(REDACTED) else scheme["scheme"] + REDACTED
    elif kind == "token" and not _credible_token(value):
        return None
    return REDACTED


def kind_of(match: re.Match[str]) -> str | None:
    """Which key of :data:`KEY_VALUE` or :data:`SECRET_KEY` matched: auth, cookie, token."""
    return next((k for k in ("auth", "cookie", "token") if match.group(k) is not None), None)


def mask_key_value(match: re.Match[str]) -> str:
    """The replacement of one :data:`KEY_VALUE` match: the key, and the value masked."""
    value = match.group("value")
    escaped = _ESCAPED_QUOTE.match(value)  # a quote inside JSON (inside JSON...): \", \\\"
    if escaped is not None and len(value) >= 2 * escaped.end() and value.endswith(escaped.group()):
        quote = escaped.group()
    else:
        quote = value[0] if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0] else ""
    inner = value[len(quote):len(value) - len(quote)]
    rest = ""
    if not quote:
        inner, rest = _outside_parentheses(match, inner)
    masked = mask_secret_value(kind_of(match), inner)
    if masked is None:
        return match.group(0)
    return f"{match.group('key')}{quote}{masked}{quote}{rest}"


def _outside_parentheses(match: re.Match[str], value: str) -> tuple[str, str]:
    """An unquoted value written inside parentheses (``failed (password=hunter2).``) cut at
    the ``)`` that closes them: ``hunter2`` masked, ``).`` given back. Only where a ``(``
    before the key is still open, so that a value holding a ``)`` of its own
    (``password=ab)cd``) is masked whole."""
    text, start = match.string, match.start()
    if ")" not in value or text.rfind("(", 0, start) <= text.rfind(")", 0, start):
        return value, ""
    depth = 0
    for i, c in enumerate(value):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return value[:i], value[i:]
    return value, ""


SECRET_SHAPES: tuple[SecretShape, ...] = (
    # -- found by pattern (DEFAULT_PATTERNS) --
    SecretShape("OpenAI / Anthropic style API keys", "sk-proj-4f9XbQ2LmN8vR1tY6wZ0", REDACTED,
                r"sk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{16,}", "sk-", ("sk-",)),
    SecretShape("Stripe secret keys", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", REDACTED,
                r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}", r"(?-i:[sr]k_(?:live|test)_)", ("k_live_", "k_test_")),
    SecretShape("AWS access key ids", "AKIAIOSFODNN7EXAMPLE", REDACTED,
                r"(?:AKIA|ASIA)[0-9A-Z]{16}", "(?-i:AKIA|ASIA)", ("akia", "asia")),
    SecretShape("GitHub tokens", "ghp_16C7e42F292c6912E7710c838347Ae178B4a", REDACTED,
                r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}", "(?-i:gh[pousr]_|github_pat_)",
                ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    SecretShape("Slack tokens", "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy", REDACTED,
                r"xox[abprs]-[A-Za-z0-9-]{10,}", "(?-i:xox[abprs]-)", ("xox",)),
    SecretShape("Google API keys", "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe", REDACTED,
                r"AIza[0-9A-Za-z_\-]{35}", "(?-i:AIza)", ("aiza",)),
    SecretShape("Bearer tokens", "Bearer 8f2b1c9e4d7a6b3c", f"Bearer {REDACTED}",
                r"(?i:\bbearer\s+)(?P<secret>[A-Za-z0-9._~+/\-]+=*)", "bearer", ("bearer",)),
    SecretShape("JWTs", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", REDACTED,
                r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", "(?-i:eyJ)", ("eyj",)),
    SecretShape("URL credentials", "postgres://app:S3cr3t@db.internal:5432/orders", f"postgres://{REDACTED}@db.internal:5432/orders",
                r"://(?P<secret>[^\s/?#@:\"'<>]*:[^\s/?#@\"'<>]+)@", r"://[^/?#@ ]*:[^/?#@ ]*@", ("://",)),
    SecretShape("PEM private key blocks", "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq\n-----END RSA PRIVATE KEY-----",
                f"-----BEGIN RSA PRIVATE KEY-----{REDACTED}-----END RSA PRIVATE KEY-----",
                r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?P<secret>[^\"]*?)"
                r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|(?=\")|\Z)",
                "(?-i:-----BEGIN [A-Z0-9 ]*PRIVATE KEY)", ("-----begin",)),
    # -- found by the key-value rule (KEY_VALUE) --
    SecretShape("Cloud secret keys", "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", f"aws_secret_access_key={REDACTED}"),
    SecretShape("Azure connection strings", "AccountName=acme;AccountKey=Zm9vYmFyYmF6cXV4MTIz==;EndpointSuffix=core.windows.net",
                f"AccountName=acme;AccountKey={REDACTED};EndpointSuffix=core.windows.net"),
    SecretShape("Secret-named values", '{"client_secret": "cs_9f8e7d6c", "password": "hunter2"}',
                f'{{"client_secret": "{REDACTED}", "password": "{REDACTED}"}}'),
    SecretShape("Tokens (not token counts)", "access_token=EAAB1234567890 max_tokens=5", f"access_token={REDACTED} max_tokens=5"),
    SecretShape("Signed URL parameters", "https://b.s3.amazonaws.com/k?X-Amz-Date=20240101T000000Z&X-Amz-Signature=9c1e0a77&key=AB12cd&sig=Zm9v%3D",
                f"https://b.s3.amazonaws.com/k?X-Amz-Date=20240101T000000Z&X-Amz-Signature={REDACTED}&key={REDACTED}&sig={REDACTED}"),
    SecretShape("Authorization headers", "Authorization: Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==", f"Authorization: Basic {REDACTED}"),
    SecretShape("Cookie headers", "Set-Cookie: sid=31d4d96e407aad42; Path=/; HttpOnly", f"Set-Cookie: {REDACTED}"),
)
"""Every shape masked by default, with an example of each and what is left of it."""

DEFAULT_PATTERNS: tuple[str, ...] = tuple(s.pattern for s in SECRET_SHAPES if s.pattern is not None)
"""The default patterns (:class:`~loopscope.content.policy.ContentPolicy` ``patterns``)."""

DEFAULT_PREFILTERS: dict[str, str] = {s.pattern: s.prefilter for s in SECRET_SHAPES if s.pattern and s.prefilter}
"""Each default pattern's RE2 prefilter (:mod:`loopscope.storage.scrub`)."""

DEFAULT_LITERALS: tuple[str, ...] = tuple(dict.fromkeys(lit for s in SECRET_SHAPES if s.pattern for lit in s.literals))
"""Every default pattern's literals (:attr:`SecretShape.literals`), together."""
