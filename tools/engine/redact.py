"""Secrets out of what mleng shows and keeps: one function, `redact`, for every log line that leaves a
reader (evidence, first failures, warnings) and for every row the results store writes.

Logs hold what programs printed, and programs print their environment, URLs and headers: an evidence
line quoted to an agent, or a row kept in SQLite for months, must not carry a token. The forms caught
are the common ones: `key=value` / `key: value` where the key names a token, secret, password or key
(in any case, with a prefix such as HF_ or AWS_), `Authorization: Bearer|Basic ...`, credentials in a
URL (`https://user:pass@host`), AWS access key ids, well-known token prefixes (GitHub, Hugging Face,
OpenAI-style `sk-`, Slack) and PEM private key blocks. The value is replaced, the key kept, so a line
still says what it was about.
"""

import re

MASK = "[REDACTED]"

# key=value and key: value, optionally quoted (JSON, YAML, shell, env dumps, CLI flags like --password=x).
_KEYED = re.compile(   # no leading [\w.-]* before the keyword: that would backtrack over every word
    r"""(?ix)
    (?P<key>(?:token|secret|passw(?:or)?d|pwd|api[_-]?key|access[_-]?key|private[_-]?key|credentials?)[\w.-]*)
    (?P<sep>["']?\s*[:=]\s*["']?)
    (?P<value>[^\s"',;&]+)""")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization|proxy-authorization)(\s*[:=]\s*)(bearer|basic|token)?(\s*)([^\s\"',;]+)")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@]+:)([^\s/@]+)(@)")
_TOKEN_SHAPES = re.compile(
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"                 # AWS access key id
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}\b|\bgithub_pat_[A-Za-z0-9_]{30,}\b"
    r"|\bhf_[A-Za-z0-9]{30,}\b"                       # Hugging Face
    r"|\bsk-[A-Za-z0-9_-]{20,}\b"                     # OpenAI-style secret keys
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}\b")             # Slack
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S)
_SECRET_KEY = re.compile(r"(?i)[\w.-]*(?:token|secret|passw(?:or)?d|pwd|api[_-]?key|access[_-]?key|private[_-]?key)[\w.-]*")
_NUMBER = re.compile(r"[\d.,]+")
_KEY_WORDS = ("token", "secret", "passw", "pwd", "key", "credential")
_SHAPE_MARKS = ("AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "hf_", "sk-", "xox")


def _keyed(m: re.Match) -> str:
    value = m["value"]
    if _NUMBER.fullmatch(value) and not re.search(r"(?i)passw|pwd|secret", m["key"]):
        return m[0]        # num_tokens=4096, max_tokens: 512 are counts, not secrets
    return f"{m['key']}{m['sep']}{MASK}"


def redact(text: str) -> str:
    """`text` with every secret in a common form replaced by [REDACTED]; text without one is returned as is.
    Each pattern runs only where a plain substring test says it could match: most lines cost a few
    `in` tests."""
    if not text:
        return text
    low = text.lower()
    if "private key-----" in low:
        text = _PEM.sub(MASK, text)
    if "authorization" in low:
        text = _AUTH_HEADER.sub(lambda m: f"{m[1]}{m[2]}{m[3] or ''}{m[4]}{MASK}", text)
    if "://" in text and "@" in text:
        text = _URL_CREDENTIALS.sub(lambda m: f"{m[1]}{MASK}{m[3]}", text)
    if any(word in low for word in _KEY_WORDS):
        text = _KEYED.sub(_keyed, text)
    if any(mark in text for mark in _SHAPE_MARKS):
        text = _TOKEN_SHAPES.sub(MASK, text)
    return text


def redact_data(value):
    """Every string inside a JSON-like value (dicts, lists) redacted; keys kept."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: MASK if isinstance(v, str) and v and _SECRET_KEY.fullmatch(str(k)) else redact_data(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact_data(v) for v in value]
    return value
