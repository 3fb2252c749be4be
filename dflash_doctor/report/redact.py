"""Secrets never leave the machine in a bug report.

Three views of the same rule, so the environment, the command line, log text and JSON are treated alike:

- `redact_text(text)`: free text (a log tail, a repro's stderr, a path, the rendered bundle). Masks the value of
  every shape in `SHAPES`: credentials in URLs, signed-URL and token query parameters, Authorization headers and
  Bearer tokens, `name=value` / `"name": "value"` / `--name value` where the name says secret, private key
  blocks (with or without their END line), and the token formats of the services ML people use.
- `redact_env(mapping)`: a variable whose name says secret (`*_TOKEN`, `*_PASS`, `*_KEY`...) hides its whole
  value; every other value still goes through `redact_text`.
- `redact_argv(argv)` and `redact_data(obj)`: the same for a command line (`--password X`, `--token=X`) and for
  parsed JSON (a key that says secret hides its value; every string is redacted as text).

No detector library fits here (the maintained ones pull in plugins, entropy scoring and network checks); the
patterns below are each tested with a planted value in tests/report/test_redact.py.
"""
from __future__ import annotations

import re
from typing import Dict, List, Mapping, Sequence, Tuple

REDACTED = "[REDACTED]"

# --- names -----------------------------------------------------------------------------------------------------
# A variable, JSON key or option whose name contains one of these is secret whatever its value looks like.
_SECRET_NAME = re.compile(
    r"TOKEN(?!IZER|S)|SECRET|PASSW(OR)?D|PASSPHRASE|(^|_)PASS($|_)|(^|_)PWD($|_)|AUTH(?!OR)|CREDENTIAL|COOKIE|"
    r"SESSION|PRIVATE|API_?KEY|ACCESS_?KEY|ACCOUNT_?KEY|(^|_)KEYS?($|_)|SIGNATURE|WEBHOOK|DSN|"
    r"CONN(ECTION)?_?STR(ING)?|(^|_)SAS($|_)",
    re.IGNORECASE,
)
# Names that match above but are not secret (PWD/OLDPWD are the shell's working folders).
_NOT_SECRET_NAME = re.compile(r"^(OLDPWD|PWD|KEYBOARD\w*|XAUTHORITY|SSH_AUTH_SOCK)$", re.IGNORECASE)

# --- shapes in free text ---------------------------------------------------------------------------------------
# Words that make `word=value`, `"word": "value"` or `--word value` a secret when they are part of the name.
# `pass`, `pwd` and a `_key` suffix only as whole parts of the name: not `bypass`, `passes` or `monkey`.
_SECRET_WORD = (
    r"secret|passw(?:or)?d|passphrase|(?<![a-z])pass(?![a-z])|(?<![a-z])pwd(?![a-z])|_key(?![a-z])|"
    r"token(?!izer|s)|api[_\-]?key|access[_\-]?key|account[_\-]?key|private[_\-]?key|credentials?|signature|"
    r"auth(?!or)"
)
# The name around the word is bounded ({0,64}) and starts where a name can start, so a long run of name
# characters costs linear time instead of a retry at every character.
_NAME = rf"[\w.\-]{{0,64}}(?:{_SECRET_WORD})[\w.\-]{{0,64}}"
# A value worth hiding: not a plain number (`max_tokens=100`), at least 4 characters, ends at a quote, space,
# separator or backslash (JSON's `\n` inside a string).
_VALUE = r"(?!\d+\b)[^\s'\",;&\\<>]{4,}"

_PRIVATE_KEY = re.compile(
    # The body is lines of base64 and `Header: value` lines, separated by real or JSON-escaped line breaks, so a
    # key cut off before its END line (a truncated log) is still masked up to where the key text stops.
    r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
    r"(?:(?:\s|\\[rn])+(?:[A-Za-z0-9+/]{16,}={0,2}|[A-Za-z0-9+/]{1,15}={0,2}(?=(?:\s|\\[rn])*-----END)|"
    r"[A-Za-z0-9+/]{1,15}={1,2}|=[A-Za-z0-9+/]{4}|[A-Za-z][\w-]{0,30}: [^\r\n\\\"]*))*"
    r"(?:(?:\s|\\[rn])*-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?"
)
_URL_USERINFO = re.compile(
    # `https://TOKEN@host`, `https://user:pw@host`, `redis://:pw@host`, `postgres://user:pw@host/db`
    r"(?P<keep>\b[a-zA-Z][a-zA-Z0-9+.\-]{0,30}://)[^/?#\[\]@\s\"'<>]+(?=@)"
)
_QUERY_SECRET = re.compile(
    # Signed URLs (AWS SigV4, Azure SAS, GCS V4) and the usual token parameters; only inside a query string.
    r"(?P<keep>[?&;](?:x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential|"
    r"sig|se|sv|st|sp|skoid|sktid|signature|key|apikey|api_key|auth|token|access_token|refresh_token|id_token|"
    r"client_secret|password|secret|code)=)[^&#\s\"'<>]+",
    re.IGNORECASE,
)
_AUTHORIZATION = re.compile(
    # `Authorization: Bearer x`, `"authorization": "token x"`, `Proxy-Authorization: Basic x`
    r"(?P<keep>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?:bearer|basic|token|digest|negotiate|ntlm|aws4-hmac-sha256)\s+)?)[^\s\"'<>]+(?:\s*,\s*[^\s\"'<>,]+)*",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<keep>\bbearer\s+)[A-Za-z0-9\-._~+/]{8,}=*", re.IGNORECASE)
_ASSIGNED = re.compile(
    # `aws_secret_access_key = x`, `DB_PASS=x`, `"token": "x"`, `password: x`
    rf"(?P<keep>(?<![\w.\-]){_NAME}['\"]?\s*[:=]\s*['\"]?){_VALUE}",
    re.IGNORECASE,
)
_FLAG_VALUE = re.compile(
    # `--password hunter2`, `--hf-token x` in a logged command line (the `=` form is _ASSIGNED's)
    rf"(?P<keep>(?<![\w-])--?{_NAME}[ \t]+['\"]?)(?!-){_VALUE}",
    re.IGNORECASE,
)
# Token formats that are secret wherever they appear; kept specific so paths and hashes survive.
_TOKENS = (
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),                              # Hugging Face
    re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}\b"),         # GitHub classic tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}\b"),                     # GitHub fine-grained tokens
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}\b"),                        # GitLab
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}\b"),            # OpenAI / Anthropic style keys
    re.compile(r"\b[rs]k_live_[A-Za-z0-9]{20,}\b"),                      # Stripe
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),                        # AWS access key ids
    re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),                           # Google API keys
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}\b"),                   # Slack
    re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"),                              # npm
    re.compile(r"\bpypi-[A-Za-z0-9_\-]{50,}"),                           # PyPI upload tokens
    re.compile(r"\bwandb_v\d_[A-Za-z0-9]{20,}\b"),                       # Weights & Biases (new format)
    re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\b"),  # JWTs
)

# (name, pattern) in the order they run; a match's `keep` group stays. The shapes that find a value by what
# surrounds it come before the token formats, since a masked token would hide where its value ends.
SHAPES: Tuple[Tuple[str, "re.Pattern[str]"], ...] = (
    ("private key block", _PRIVATE_KEY),
    ("URL credentials", _URL_USERINFO),
    ("query parameter", _QUERY_SECRET),
    ("Authorization header", _AUTHORIZATION),
    ("Bearer token", _BEARER),
    ("secret assignment", _ASSIGNED),
    ("secret option value", _FLAG_VALUE),
) + tuple((f"token format {p.pattern[:12]}", p) for p in _TOKENS)


def _mask(match: "re.Match[str]") -> str:
    keep = match.groupdict().get("keep")
    if keep is None:
        return REDACTED
    return keep + REDACTED


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name)) and not _NOT_SECRET_NAME.match(name)


def redact_text(text: str) -> str:
    """Mask every secret shape in free text."""
    for _, pattern in SHAPES:
        text = pattern.sub(_mask, text)
    return text


def redact_value(name: str, value: str) -> str:
    if is_secret_name(name):
        return REDACTED if value else value
    return redact_text(value)


def redact_env(env: Mapping[str, str]) -> Dict[str, str]:
    return {name: redact_value(name, value) for name, value in env.items()}


def _option_name(arg: str) -> str:
    return arg.lstrip("-").split("=", 1)[0].replace("-", "_")


def redact_argv(argv: Sequence[str]) -> List[str]:
    """A command line with the values of secret options masked: `--password X`, `--token=X`, `-p X` is left
    (a short flag says nothing about its value) unless its value has a secret shape of its own."""
    redacted: List[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            redacted.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if arg.startswith("--") and is_secret_name(_option_name(arg)):
            if "=" in arg:
                redacted.append(arg.split("=", 1)[0] + "=" + REDACTED)
                continue
            hide_next = True
        redacted.append(redact_text(arg))
    return redacted


def redact_data(value: object) -> object:
    """A JSON-like structure with secrets masked: a key that says secret hides its string value (numbers are
    counts and sizes, not secrets), a list of strings is read as a command line, and every other string is
    redacted as text, keys included."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        result: Dict[object, object] = {}
        for key, item in value.items():
            if isinstance(key, str) and isinstance(item, str) and item and is_secret_name(key):
                result[redact_text(key)] = REDACTED
            else:
                result[redact_text(key) if isinstance(key, str) else key] = redact_data(item)
        return result
    if isinstance(value, (list, tuple)):
        if all(isinstance(item, str) for item in value):  # maybe a command line: ["--password", "x"]
            return redact_argv(value)
        return [redact_data(item) for item in value]
    return value
