"""Secrets never reach a shared report: secret-looking names, token-shaped values, URL credentials."""
from __future__ import annotations

import pytest

from dflash_doctor.report.redact import REDACTED, is_secret_name, redact_env, redact_text

# Planted values shaped like the real thing (fake: none of these was ever a credential).
HF = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmNoPq"
GITHUB = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0PoNmLkJi"
GITHUB_FINE = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuv"
OPENAI = "sk-" + "proj-AbCdEfGhIjKlMnOpQrStUvWx12"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
SLACK = "xoxb-" + "123456789012-abcdefABCDEF"
JWT = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0" + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"


@pytest.mark.parametrize("token", [HF, GITHUB, GITHUB_FINE, OPENAI, AWS_ID, SLACK, JWT])
def test_token_shaped_values_are_masked_anywhere_in_text(token):
    text = f"loading with {token} from /home/me/run.py, then {token}."
    redacted = redact_text(text)
    assert token not in redacted
    assert redacted == f"loading with {REDACTED} from /home/me/run.py, then {REDACTED}."


def test_url_credentials_lose_user_and_password_but_keep_the_host():
    text = "index https://alice:s3cr3t-pass@pypi.example.com/simple and git+ssh://bob:pw1234@git.example.com/x.git"
    assert redact_text(text) == (
        f"index https://{REDACTED}@pypi.example.com/simple and git+ssh://{REDACTED}@git.example.com/x.git"
    )


@pytest.mark.parametrize("text, expected", [
    ("aws_secret_access_key = wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY", f"aws_secret_access_key = {REDACTED}"),
    ('{"password": "hunter22"}', f'{{"password": "{REDACTED}"}}'),
    ("--api-key=abcd1234efgh", f"--api-key={REDACTED}"),
    ("max_tokens=100 num_tokens: 4096", "max_tokens=100 num_tokens: 4096"),  # numbers are not secrets
])
def test_assigned_secrets_in_free_text(text, expected):
    assert redact_text(text) == expected


def test_ordinary_text_survives_untouched():
    text = (
        "torch 2.13.0+cpu at /usr/lib/python3/site-packages/torch, commit 85971b3e048f61a6d643b95fc6233d073302f5b8, "
        "TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_root, sk-short, hf_x, RuntimeError: Detected that you are using FX"
    )
    assert redact_text(text) == text


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "DB_PASSWORD",
    "NCCL_AUTH", "MY_CREDENTIALS", "OPENAI_API_KEY", "SESSION_COOKIE", "SSH_PRIVATE", "KEY",
])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "PWD", "OLDPWD", "TORCH_LOGS", "CUDA_VISIBLE_DEVICES", "GIT_AUTHOR_NAME", "TOKENIZERS_PARALLELISM", "HOME",
    "SSH_AUTH_SOCK", "MONKEY_BUSINESS",
])
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_redact_env_masks_by_name_and_by_value():
    env = {
        "HF_TOKEN": "anything-at-all",
        "TORCH_LOGS": "recompiles",
        "NCCL_SOCKET_IFNAME": GITHUB,
        "PIP_INDEX_URL": "https://u:p4ssw0rd@mirror.example/simple",
        "EMPTY_TOKEN": "",
    }
    assert redact_env(env) == {
        "HF_TOKEN": REDACTED,
        "TORCH_LOGS": "recompiles",
        "NCCL_SOCKET_IFNAME": REDACTED,
        "PIP_INDEX_URL": f"https://{REDACTED}@mirror.example/simple",
        "EMPTY_TOKEN": "",
    }
