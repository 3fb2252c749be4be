"""Secrets never reach a shared report: secret-looking names, token-shaped values, URL credentials."""
from __future__ import annotations

import pytest

from dflash_doctor.report.redact import REDACTED, is_secret_name, redact_argv, redact_data, redact_env, redact_text

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


# --- issue 16: every shape the attack found printed verbatim, one planted value each -----------------------------
TOKEN = "tok" + "3n-9f8e7d6c5b4a3210"
PASSWORD = "pw-" + "Hunter2Hunter2"
PEM_BODY = "\n".join(["MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"] * 3 + ["MqHp9Q=="])
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----"
OPENSSH_CUT = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
               "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
               "QyNTUxOQAAACB3ZjVqcmRkZWV0b3JtZW50ZnJvbWhlcmU")  # a log cut off before the END line


@pytest.mark.parametrize("text, secret, survivor", [
    (f"git clone https://{TOKEN}@github.com/org/repo.git", TOKEN, "@github.com/org/repo.git"),
    (f"https://alice:{PASSWORD}@hub.example.com/x", PASSWORD, "@hub.example.com/x"),
    (f"REDIS_URL=redis://:{PASSWORD}@cache:6379/0", PASSWORD, "@cache:6379/0"),
    (f"db postgres://app:{PASSWORD}@db.internal:5432/runs", PASSWORD, "@db.internal:5432/runs"),
    (f"https://b.s3.amazonaws.com/w.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={TOKEN}%2F20260101"
     f"&X-Amz-Signature={PASSWORD}", PASSWORD, "X-Amz-Algorithm=AWS4-HMAC-SHA256"),
    (f"https://b.s3.amazonaws.com/w.pt?X-Amz-Credential={TOKEN}%2F20260101&X-Amz-Date=20260101T000000Z",
     TOKEN, "X-Amz-Date=20260101T000000Z"),
    (f"https://b.s3.amazonaws.com/w.pt?X-Amz-Security-Token={TOKEN}&x=1", TOKEN, "&x=1"),
    (f"https://acct.blob.core.windows.net/c/w.pt?sv=2022-11-02&se=2026-01-01&sp=r&sig={PASSWORD}", PASSWORD,
     "acct.blob.core.windows.net/c/w.pt?"),
    (f"https://storage.googleapis.com/b/w.pt?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature={PASSWORD}",
     PASSWORD, "X-Goog-Algorithm=GOOG4-RSA-SHA256"),
    (f"GET https://api.example.com/v1/models?key={TOKEN}", TOKEN, "/v1/models?key="),
    (f"GET https://api.example.com/v1/models?page=2&auth={TOKEN}", TOKEN, "?page=2&auth="),
    (f"https://hooks.example.com/x?token={TOKEN}", TOKEN, "?token="),
    (f"https://graph.example.com/me?fields=id&access_token={TOKEN}", TOKEN, "?fields=id&access_token="),
    (f"curl -H 'Authorization: Bearer {TOKEN}' https://x", TOKEN, "Authorization: Bearer "),
    (f'{{"headers": {{"Authorization": "token {TOKEN}"}}}}', TOKEN, '"Authorization": "token '),
    (f"Authorization: Basic {TOKEN}", TOKEN, "Authorization: Basic "),
    (f"requests.get(url, headers=auth) -> sent bearer {TOKEN}", TOKEN, "sent bearer "),
    (f"export DB_PASS={PASSWORD}", PASSWORD, "export DB_PASS="),
    (f"STRIPE_KEY={PASSWORD} next", PASSWORD, " next"),
    (f"run.py --password {PASSWORD} --steps 30", PASSWORD, "--steps 30"),
    (f"run.py --password={PASSWORD} --steps 30", PASSWORD, "--steps 30"),
    (f"run.py --token {TOKEN} --steps 30", TOKEN, "--steps 30"),
    (f"run.py --hf-token {TOKEN}", TOKEN, "run.py --hf-token "),
    (f"before\n{PEM}\nafter", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj", "after"),
    (f"before\n{PEM}\nafter", "MqHp9Q==", "after"),
    (f"stderr: {OPENSSH_CUT}\n(truncated)", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
     "(truncated)"),
    (f"stderr: {OPENSSH_CUT}\n(truncated)", "QyNTUxOQAAACB3ZjVqcmRkZWV0b3JtZW50ZnJvbWhlcmU", "(truncated)"),
    (f"loaded key {AWS_ID} for us-east-1", AWS_ID, " for us-east-1"),
    (f"GH {GITHUB} and {GITHUB_FINE}", GITHUB_FINE, "GH "),
    (f"HF {HF}", HF, "HF "),
    (f"slack {SLACK}", SLACK, "slack "),
    ("slack xoxp-" + "1234567890-abcdefghij", "xoxp-" + "1234567890-abcdefghij", "slack "),
    ("slack xoxa-" + "2-abcdefghij12", "xoxa-" + "2-abcdefghij12", "slack "),
])
def test_each_secret_shape_is_masked_and_its_surroundings_kept(text, secret, survivor):
    redacted = redact_text(text)
    assert secret not in redacted
    assert survivor in redacted
    assert REDACTED in redacted
    assert redact_text(redacted) == redacted  # redacting twice (per block, then the whole page) changes nothing


def test_a_private_key_in_json_text_is_masked_with_or_without_its_end_line():
    import json

    for key in (PEM, OPENSSH_CUT):
        text = json.dumps({"stderr_tail": f"loading\n{key}\n", "verdict": "reproduced"})
        redacted = redact_text(text)
        assert "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj" not in redacted
        assert "QyNTUxOQAAACB3ZjVqcmRkZWV0b3JtZW50ZnJvbWhlcmU" not in redacted
        assert json.loads(redacted)["verdict"] == "reproduced"  # still JSON, the rest intact


@pytest.mark.parametrize("name", [
    "DB_PASS", "SMTP_PASSWORD", "NCCL_TOKEN", "APP_SECRET", "STRIPE_KEY", "GCP_CREDENTIALS", "DFLASH_PASS",
    "AZURE_STORAGE_CONNECTION_STRING", "PASS",
])
def test_secret_name_suffixes(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["BYPASS_CACHE", "COMPASS_DIR", "TOKENS_PER_STEP", "KEYBOARD_LAYOUT"])
def test_names_that_only_look_secret(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("text", [
    "bypass_cache: true", "passes=3", "tokenizer: gpt2", "max_tokens: 4096", "tokens_per_s=1234.5",
    "https://github.com/org/repo@v1.2", "see https://example.com/a?page=2&lang=en", "user@example.com",
    "Basic usage: dflash-doctor scan", "monkey_patch=yes",
])
def test_lookalikes_survive(text):
    assert redact_text(text) == text


def test_argv_hides_the_values_of_secret_options_only():
    argv = ["dflash-doctor", "report", "--password", PASSWORD, "--token=" + TOKEN, "--hf-token", TOKEN,
            "--steps", "30", f"https://{TOKEN}@host/x", "--api-key", "--no-probes"]
    assert redact_argv(argv) == [
        "dflash-doctor", "report", "--password", REDACTED, "--token=" + REDACTED, "--hf-token", REDACTED,
        "--steps", "30", f"https://{REDACTED}@host/x", "--api-key", "--no-probes"]


def test_json_data_hides_values_under_secret_keys_and_shapes_anywhere():
    data = {"env": {"HF_TOKEN": "anything", "DB_PASS": PASSWORD, "tokens_per_s": 1234.5, "TORCH_LOGS": "+dynamo"},
            "stderr": [f"Authorization: Bearer {TOKEN}"], "count": 3, "api_key": 12345, "nested": [{"secret": "x"}],
            "argv": ["train.py", "--password", PASSWORD, "--steps", "3"]}
    assert redact_data(data) == {
        "env": {"HF_TOKEN": REDACTED, "DB_PASS": REDACTED, "tokens_per_s": 1234.5, "TORCH_LOGS": "+dynamo"},
        "stderr": [f"Authorization: Bearer {REDACTED}"], "count": 3, "api_key": 12345,
        "nested": [{"secret": REDACTED}], "argv": ["train.py", "--password", REDACTED, "--steps", "3"]}


@pytest.mark.timeout(30)
def test_hostile_text_does_not_hang_the_patterns():
    # Long runs of name characters and separators are what a backtracking pattern chokes on: with a retry at
    # every character these 600 k characters take hours; linear, well under a second.
    hostile = ("a." * 50_000) + ("x" * 100_000) + ("--" * 20_000) + "=" * 1000 + "password=" * 20_000 + (
        "-----BEGIN PRIVATE KEY-----\n" * 200) + ("a_b " * 50_000)
    assert redact_text(hostile).startswith("a.a.")
