"""Secrets out of what mleng shows and keeps: one function, `redact`, for every log line that leaves a
reader (evidence, first failures, warnings), for env_report's variables, and for every row the results
store writes (store.save calls `redact_data` itself, so no writer can forget).

Logs hold what programs printed, and programs print their environment, command lines, URLs and
headers: an evidence line quoted to an agent, or a row kept in SQLite for months, must not carry a
token. The forms caught (tests/fixtures/secrets/forms.jsonl measures them):
- `key=value` / `key: value` / `"key": "value"` where the key names a token, secret, password or key
  (any case, any prefix: HF_TOKEN, AccountKey, client_secret), quoted values whole;
- flags and words followed by the secret: `--password X`, `--token X`, `-p X` after sshpass,
  `mysql -pX`, `curl -u user:X`, a .netrc `password X`, "the password is X";
- `Authorization:` / `Proxy-Authorization:` headers, a bare `Bearer X`, `Cookie:` / `Set-Cookie:`;
- credentials in a URL (`scheme://user:pass@`, `redis://:pass@`) and signed queries (`sig=`,
  `X-Amz-Signature=`, `X-Goog-Signature=`, `access_token=`...), Slack/Discord webhook paths;
- token shapes: AWS key ids, GitHub, GitLab, Hugging Face, OpenAI/Anthropic `sk-`, Slack, Google API
  keys and OAuth tokens, Stripe, npm, PyPI, SendGrid, DigitalOcean, JWTs; PEM and PGP private keys.
The value is replaced, the key kept, so a line still says what it was about. Every pattern is linear
(bounded or possessive runs, no nested quantifiers, no `.*` before an anchor) and runs only where a substring test says it could
match: most lines cost a few `in` tests.
"""

import re

MASK = "[REDACTED]"
_SECRET_WORDS = r"token|secret|passw(?:or)?d|passphrase|pwd|api[_-]?key|access[_-]?key|private[_-]?key|" \
                r"account[_-]?key|shared[_-]?access[_-]?key|credentials?|auth[_-]?key|session[_-]?key|signing[_-]?key|" \
                r"sharedaccesssignature|session[_-]?id"

# key=value and key: value; a quoted value is taken whole (password="correct horse battery").
_KEYED = re.compile(   # no leading [\w.-]* before the keyword: that would backtrack over every word
    r"""(?ix)
    (?P<key>(?:""" + _SECRET_WORDS + r""")[\w.-]{0,64}+)
    (?P<sep>\\?["']?\s{0,8}(?:=>|:=|[:=])\s{0,8})
    (?:(?P<q>\\?["'])(?P<quoted>[^"'\\\n]{0,256})(?P=q)|(?P<value>[^\s"'\\,;&}]+))""")
# A flag or a word, then whitespace, then the secret: --password X, --api-key X, netrc "password X",
# "the db password is X". Only words that are secrets themselves (not "token", a unit in ML logs).
_WORD_THEN_VALUE = re.compile(
    r"(?i)(?P<key>\b(?:passw(?:or)?d|passphrase|secret))(?P<sep>\s{1,8}(?:is\s{1,8}|was\s{1,8})?)(?P<value>[^\s\"',;]+)")
# A flag, then whitespace, then its value: --password X, --api-key X, --pass X. Flags are found alone (a flag
# starts where no word or dash stands before it, so a run of dashes costs one try, not one per dash) and their
# names are tested afterwards: one pattern with the secret words inside the flag was quadratic on long lines.
_FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]{0,80}")
_VALUE_AFTER = re.compile(r"\s{1,8}([^\s\"',;]+)")
_SECRET_FLAG = re.compile(r"(?i)token|secret|passw(?:or)?d|passphrase|api[_-]?key|access[_-]?key")
_FLAG_WITHOUT_VALUE = re.compile(r"(?i)-stdin$|-file$|-env$|-prompt$")   # --password-stdin takes no secret
_AUTH_HEADER = re.compile(r"(?i)\b(authorization|proxy-authorization)(\s*[:=]\s*)(bearer|basic|token|digest)?(\s*)([^\s\"',;]+)")
_BEARER = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9._~+/=-]{8,})")
_COOKIE = re.compile(r"(?i)\b((?:set-)?cookie\s*:\s*)([^\n\"']+)")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,20}://[^\s/:@]{0,256}:)([^\s/@]{1,256})(@)")
_URL_TOKEN_USER = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,20}://)([A-Za-z0-9_-]{32,256})(@)")   # https://<token>@host
_SIGNED_QUERY = re.compile(
    r"(?i)([?&;](?:sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
    r"x-goog-credential|awsaccesskeyid|access_token|id_token|refresh_token|api_key|apikey|key|token|code|"
    r"client_secret|password|se|skoid|sktid)=)([^&\s\"'#]+)")
_SAS_SIGNATURE = re.compile(r"(?i)((?:^|[\s&;?])sig=)([^&\s\"'#;]+)")
_WEBHOOK = re.compile(r"(?i)(https://(?:hooks\.slack\.com/services|discord(?:app)?\.com/api/webhooks)/)([^\s\"'<>]+)")
_DASH_P_ATTACHED = re.compile(r"(?<=\s)(-p)(?=[^\s-])(\S+)")                 # mysql -pSECRET
_DASH_P_SPACED = re.compile(r"(?<=\s)(-p\s+)(\S+)")                         # sshpass -p / docker login -p SECRET
_DASH_A_SPACED = re.compile(r"(?<=\s)(-a\s+)(\S+)")                         # redis-cli -a SECRET
_WANDB_LOGIN = re.compile(r"(?i)\b(wandb\s{1,8}login\s{1,8}(?:--?[\w-]{1,20}\s{1,8}){0,4})([0-9a-f]{40})\b")   # W&B key
_USER_PASS = re.compile(r"(?<=\s)((?:-u|--user)\s{1,8}[^\s:]{1,128}:)(\S+)")          # curl -u user:SECRET
_TOKEN_SHAPES = re.compile(
    r"\b(?:AKIA|ASIA|AROA|AIDA)[0-9A-Z]{16}\b"       # AWS key ids
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}\b|\bgithub_pat_[A-Za-z0-9_]{30,}\b"
    r"|\bglpat-[A-Za-z0-9_-]{20,}\b"                  # GitLab
    r"|\bhf_[A-Za-z0-9]{10,}\b"                       # Hugging Face
    r"|\bsk-[A-Za-z0-9_-]{20,}\b"                     # OpenAI / Anthropic secret keys
    r"|\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b"  # Stripe
    r"|\bxox[abprse]-[A-Za-z0-9-]{10,}\b|\bxapp-[A-Za-z0-9-]{10,}\b"   # Slack bot/user/refresh, app-level
    r"|\bnvapi-[A-Za-z0-9_-]{20,}|\bwhsec_[A-Za-z0-9]{16,}\b"            # NGC API key, Stripe webhook secret
    r"|\bhvs\.[A-Za-z0-9_-]{20,}|\bGOCSPX-[A-Za-z0-9_-]{20,}"            # Vault token, Google OAuth client secret
    r"|\bglrt-[A-Za-z0-9_-]{20,}|\bglsa_[A-Za-z0-9_]{20,}"                # GitLab runner, Grafana service account
    r"|\bAIza[0-9A-Za-z_-]{35}\b|\bya29\.[0-9A-Za-z_-]{20,}"   # Google API key, OAuth access token
    r"|\bnpm_[A-Za-z0-9]{36}\b|\bpypi-[A-Za-z0-9_-]{50,}"      # npm, PyPI
    r"|\bSG\.[A-Za-z0-9_-]{20,}\.[A-Za-z0-9_-]{20,}"           # SendGrid
    r"|\bdop_v1_[a-f0-9]{64}\b|\bdapi[a-f0-9]{32}\b"           # DigitalOcean, Databricks
    r"|\beyJ[A-Za-z0-9_-]{8,512}\.eyJ[A-Za-z0-9_-]{8,8192}\.[A-Za-z0-9_-]+")   # JWT (header.payload.signature)
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z ]*PRIVATE KEY(?: BLOCK)?-----|$)",
                  re.S)
# Names of variables and JSON keys whose whole value is secret (env_report, stored params): the words
# above, and names ending in KEY (NVIDIA_NGC_KEY, OPENAI_API_KEY; not NCCL_IB_PKEY, a partition number).
_SECRET_KEY = re.compile(r"(?i)[\w.-]{0,64}(?:" + _SECRET_WORDS + r")[\w.-]{0,64}")
_ENV_KEY = re.compile(r"[A-Z0-9_]{0,64}_(?:KEY|PASS|PW|PASSWD)")     # case-sensitive: a JSON field "key" is a figure's name
_ENV_ASSIGN = re.compile(r"\b([A-Z][A-Z0-9_]{0,64}_(?:KEY|PASS|PW|PASSWD)\s{0,8}[:=]\s{0,8})([^\s\"',;]+)")   # NGC_KEY=, DB_PASS=
_DOCKER_AUTH = re.compile(r"""(\\?["']auth\\?["']\s{0,8}:\s{0,8}\\?["'])([A-Za-z0-9+/=]{8,4096})""")
# A bare AWS secret access key: 40 characters of base64's alphabet with upper, lower and a digit (a git sha
# is lowercase hex and stays), standing alone between separators.
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])"
                         r"(?=[A-Za-z0-9/+]{0,39}[0-9])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
# A token a terminal wrapped: a known prefix running to the end of a line, its rest on the next line alone.
_WRAPPED_TOKEN = re.compile(r"\b(?:hf_|gh[pousr]_|github_pat_|glpat-|sk-|nvapi-|xox[abprse]-|xapp-)[A-Za-z0-9_-]{4,256}"
                            r"\r?\n[A-Za-z0-9_-]{6,256}(?=\s|$)")
# A keyed value at a line's end whose rest a terminal wrapped onto the next line alone.
_WRAPPED_VALUE = re.compile(r"(?i)((?:" + _SECRET_WORDS + r")[\w.-]{0,64}+\s{0,8}[:=]\s{0,8})[^\s\"',;]{1,256}\r?\n"
                            r"([A-Za-z0-9_/+=-]{6,256})(?=\s|$)")
# Separators and letters written so that a plain search misses them: URL-encoded, fullwidth, zero-width.
_DISGUISES = {"%3d": "=", "%3D": "=", "%3a": ":", "%3A": ":", "\uff1d": "=", "\uff1a": ":"}
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))
_NUMBER = re.compile(r"[\d.,]+")
# An environment list entry: {"name": "HF_TOKEN", "value": "..."} (Kubernetes, ECS) or YAML "- name: X\n  value: ...".
_NAME_VALUE = re.compile(r"""(?P<head>["']?name["']?\s{0,8}:\s{0,8}["']?(?P<name>[\w.-]{1,64})["']?\s{0,8}[,\n]\s{0,64}"""
                         r"""["']?value["']?\s{0,8}:\s{0,8}["']?)(?P<value>[^\s"',}]{1,4096})""")
_ANSI = re.compile(r"\x1b\[[0-9;]{0,16}[A-Za-z]")     # colour codes between a key and its '=' hide it
_KEY_WORDS = ("token", "secret", "passw", "passphrase", "pwd", "key", "credential", "session")
_SHAPE_MARKS = ("AKIA", "ASIA", "AROA", "AIDA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-",
                "hf_", "sk-", "sk_", "rk_", "xox", "xapp-", "AIza", "ya29.", "npm_", "pypi-", "SG.", "dop_v1_", "dapi",
                "eyJ", "nvapi-", "whsec_", "hvs.", "GOCSPX-", "glrt-", "glsa_")


def _keyed(m: re.Match) -> str:
    value = m["value"] if m["value"] is not None else m["quoted"]
    if value == MASK or (_NUMBER.fullmatch(value) and not re.search(r"(?i)passw|pwd|secret", m["key"])):
        return m[0]        # num_tokens=4096, max_tokens: 512 are counts, not secrets
    q = m["q"] or ""
    return f"{m['key']}{m['sep']}{q}{MASK}{q}"


def _mask_flag_values(text: str) -> str:
    """The value after every flag whose name says it is a secret (--password X, --hf-token X, --pass X)."""
    spans = []
    for m in _FLAG.finditer(text):
        key = m[0]
        if not (key.lower() == "--pass" or _SECRET_FLAG.search(key)) or _FLAG_WITHOUT_VALUE.search(key):
            continue
        value = _VALUE_AFTER.match(text, m.end())
        if value and not value[1].startswith("[REDACTED"):
            spans.append(value.span(1))
    for start, end in reversed(spans):
        text = text[:start] + MASK + text[end:]
    return text


def _word_then_value(m: re.Match) -> str:
    if m["value"] == MASK or m["value"].startswith("[REDACTED"):
        return m[0]
    return f"{m['key']}{m['sep']}{MASK}"


def redact(text: str) -> str:
    """`text` with every secret in a common form replaced by [REDACTED]; text without one is returned as is.

    A separator or keyword written so that a plain search misses it (`password%3DX`, a fullwidth `＝`, a
    zero-width space inside `password`) is read as its plain form; the line then comes back in that form,
    and unchanged when nothing in it was secret."""
    if not text:
        return text
    plain = _undisguised(text)
    out = _redact_plain(plain)
    return text if out == plain else out


def _undisguised(text: str) -> str:
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if text.isascii() and "%3" not in text:
        return text
    text = text.translate(_INVISIBLE)
    for disguise, plain in _DISGUISES.items():
        if disguise in text:
            text = text.replace(disguise, plain)
    return text


def _redact_plain(text: str) -> str:
    low = text.lower()
    if "private key" in low:
        text = _PEM.sub(MASK, text)
    if "authorization" in low:
        text = _AUTH_HEADER.sub(lambda m: f"{m[1]}{m[2]}{m[3] or ''}{m[4]}{MASK}", text)
    if "bearer" in low:
        text = _BEARER.sub(lambda m: m[1] + (m[2] if m[2] == MASK else MASK), text)
    if "cookie" in low:
        text = _COOKIE.sub(lambda m: m[1] + MASK, text)
    if "://" in text:
        if "@" in text:
            text = _URL_CREDENTIALS.sub(lambda m: f"{m[1]}{MASK}{m[3]}", text)
            text = _URL_TOKEN_USER.sub(lambda m: f"{m[1]}{MASK}{m[3]}", text)
        if "=" in text:
            text = _SIGNED_QUERY.sub(lambda m: m[1] + MASK, text)
        if "hooks" in low or "webhooks" in low:
            text = _WEBHOOK.sub(lambda m: m[1] + MASK, text)
    if "sig=" in low:
        text = _SAS_SIGNATURE.sub(lambda m: m[1] + (m[2] if m[2] == MASK else MASK), text)
    if " -p" in text and ("mysql" in low or "mariadb" in low):
        text = _DASH_P_ATTACHED.sub(lambda m: m[1] + MASK, text)
    if " -p" in text and ("sshpass" in low or " login" in low):
        text = _DASH_P_SPACED.sub(lambda m: m[1] + MASK, text)
    if " -a" in text and "redis-cli" in low:
        text = _DASH_A_SPACED.sub(lambda m: m[1] + MASK, text)
    if "wandb" in low:
        text = _WANDB_LOGIN.sub(lambda m: m[1] + MASK, text)
    if " -u" in text or " --user" in text:
        text = _USER_PASS.sub(lambda m: m[1] + MASK, text)
    if "auth" in low:
        text = _DOCKER_AUTH.sub(lambda m: m[1] + MASK, text)
    if "\n" in text:
        text = _WRAPPED_TOKEN.sub(MASK, text)
        if any(word in low for word in _KEY_WORDS):
            text = _WRAPPED_VALUE.sub(lambda m: m[1] + MASK, text)
    if any(word in low for word in _KEY_WORDS) or "_pass" in low or "_pw" in low or "--pass" in low:
        text = _KEYED.sub(_keyed, text)
        text = _ENV_ASSIGN.sub(lambda m: m[1] + (m[2] if m[2] == MASK else MASK), text)
        text = _WORD_THEN_VALUE.sub(_word_then_value, text)
        if "-" in text:
            text = _mask_flag_values(text)
    if "value" in low and "name" in low:
        text = _NAME_VALUE.sub(lambda m: m["head"] + (MASK if is_secret_name(m["name"]) else m["value"]), text)
    if any(mark in text for mark in _SHAPE_MARKS):
        text = _TOKEN_SHAPES.sub(MASK, text)
    if len(text) >= 40:
        text = _AWS_SECRET.sub(MASK, text)
    return text


def is_secret_name(name: str) -> bool:
    """True for a variable or key name whose value is secret as a whole (HF_TOKEN, NVIDIA_NGC_KEY)."""
    return bool(_SECRET_KEY.fullmatch(name) or _ENV_KEY.fullmatch(name))


def redact_data(value):
    """Every string inside a JSON-like value (dicts, lists) redacted; keys kept, and the value of a key
    that names a secret replaced whole."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: MASK if isinstance(v, str) and v and is_secret_name(str(k)) else redact_data(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact_data(v) for v in value]
    return value
