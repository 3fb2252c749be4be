"""Secrets never leave the machine in a bug report: names that look secret hide their value, values that look
like tokens are masked wherever they appear, and URLs lose their user:password@ part.

Redaction is applied twice: to each environment variable as it is collected, and to the whole rendered bundle
(a token can also hide in a path, a log tail or a repro's stderr).
"""
from __future__ import annotations

import re
from typing import Dict, Mapping

REDACTED = "[REDACTED]"

# A variable whose name contains one of these words is secret whatever its value looks like.
_SECRET_NAME = re.compile(
    r"TOKEN(?!IZER)|SECRET|PASSW(OR)?D|PASSPHRASE|\bPWD\b|_PWD\b|AUTH(?!OR)|CREDENTIAL|COOKIE|SESSION|PRIVATE|API_?KEY|"
    r"ACCESS_?KEY|(^|_)KEY($|_)|SIGNATURE|WEBHOOK|DSN",
    re.IGNORECASE,
)
# Names containing these parts are not secret even though they match above (PWD is the shell's working dir).
_NOT_SECRET_NAME = re.compile(r"^(OLDPWD|PWD|KEYBOARD\w*|XAUTHORITY|SSH_AUTH_SOCK)$", re.IGNORECASE)

# Token shapes of the services ML people use most; kept specific so paths and hashes survive.
_TOKEN_PATTERNS = (
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),                              # Hugging Face
    re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}\b"),         # GitHub classic tokens
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}\b"),                     # GitHub fine-grained tokens
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}\b"),                        # GitLab
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,}\b"),            # OpenAI / Anthropic style keys
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),                        # AWS access key ids
    re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}\b"),                   # Slack
    re.compile(r"\bwandb_v\d_[A-Za-z0-9]{20,}\b"),                       # Weights & Biases (new format)
    re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\b"),  # JWTs
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
)
# `aws_secret_access_key = ...`, `password: ...`, `"token": "..."` inside a longer value, a log line or JSON;
# plain numbers (`max_tokens=100`) and very short values are left alone; a backslash ends the value (JSON's \n).
_ASSIGNED_SECRET = re.compile(
    r"(?P<key>\b[\w.\-]*(?:secret|passw(?:or)?d|token|api[_\-]?key|access[_\-]?key)[\w.\-]*['\"]?\s*[:=]\s*)"
    r"(?P<quote>['\"]?)(?P<value>(?!\d+\b)[^\s'\",;&\\]{4,})",
    re.IGNORECASE,
)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<userinfo>[^/\s:@]+:[^/\s@]+)@")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name)) and not _NOT_SECRET_NAME.match(name)


def redact_text(text: str) -> str:
    """Mask every token-shaped value, `key=value` secret and URL credential in free text."""
    # Assignments first: once a token inside one is masked, the value pattern could no longer find its end.
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _ASSIGNED_SECRET.sub(lambda m: m.group("key") + m.group("quote") + REDACTED, text)
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def redact_value(name: str, value: str) -> str:
    if is_secret_name(name):
        return REDACTED if value else value
    return redact_text(value)


def redact_env(env: Mapping[str, str]) -> Dict[str, str]:
    return {name: redact_value(name, value) for name, value in env.items()}
