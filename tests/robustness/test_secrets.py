"""Secrets never reach the bug-report bundle: planted in the environment, the command line, a repro result's
JSON and log tail, and a scanned path, in every shape the attack found, none is printed or written."""
from __future__ import annotations

import json

import pytest

from tests.report.test_redact import AWS_ID, GITHUB, GITHUB_FINE, HF, SLACK
from tests.robustness.harness import run

# Fake values shaped like the real thing; none was ever a credential.
TOKEN = "tKn" + "9f8e7d6c5b4a3210zyxw"
PASSWORD = "Pw0" + "rd-Hunter2-Hunter2"
SIGNATURE = "5ig" + "0123456789abcdef0123456789abcdef"
KEY_LINE = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
PRIVATE_KEY_WITHOUT_END = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_LINE}\n{KEY_LINE[::-1]}"

SECRETS = (TOKEN, PASSWORD, SIGNATURE, HF, GITHUB, GITHUB_FINE, AWS_ID, SLACK, KEY_LINE, KEY_LINE[::-1])

PLANTED_ENV = {
    "HF_TOKEN": HF,
    "DFLASH_PASS": PASSWORD,
    "TORCH_DB_PASSWORD": PASSWORD + "x",
    "NCCL_SECRET": TOKEN + "x",
    "WANDB_KEY": TOKEN + "y",
    "HF_CREDENTIALS": TOKEN + "z",
    "HF_ENDPOINT": f"https://{TOKEN}@hub.example.com",
    "HF_MIRROR": f"https://alice:{PASSWORD}@mirror.example.com",
    "TORCHINDUCTOR_REMOTE_CACHE": f"redis://:{PASSWORD}@cache.example.com:6379",
    "DFLASH_RUNS_DB": f"postgres://app:{PASSWORD}@db.example.com/runs",
    "DFLASH_WEIGHTS": f"https://b.s3.amazonaws.com/w.pt?X-Amz-Credential={AWS_ID}%2F20260101"
                      f"&X-Amz-Signature={SIGNATURE}&X-Amz-Security-Token={TOKEN}",
    "DFLASH_AZURE": f"https://a.blob.core.windows.net/c/w.pt?sv=2022-11-02&se=2026-01-01&sp=r&sig={SIGNATURE}",
    "DFLASH_GCS": f"https://storage.googleapis.com/b/w.pt?X-Goog-Signature={SIGNATURE}",
    "DFLASH_API": f"https://api.example.com/v1?key={TOKEN}&auth={TOKEN}&token={TOKEN}&access_token={TOKEN}",
    "DFLASH_HEADERS": f"Authorization: Bearer {TOKEN}",
    "DFLASH_DEPLOY": PRIVATE_KEY_WITHOUT_END,
    "TORCH_IDS": f"{AWS_ID} {GITHUB} {GITHUB_FINE} {SLACK}",
    "TORCH_LOGS": "recompiles",
}


@pytest.fixture
def planted(tmp_path):
    source = tmp_path / f"src-{GITHUB}"
    source.mkdir()
    (source / "train.py").write_text("import torch\ntorch.utils.checkpoint.checkpoint(f, x, use_reentrant=True)\n")
    repro = {
        "tool": "dflash-doctor", "command": "repro", "exit_code": 1, "findings": [], "problems": [],
        "facts": {
            "verdict": "reproduced",
            # where, when and by which command (report leaves out a result that cannot say)
            "made": {"command": f"dflash-doctor repro --token={TOKEN}", "host": "gpu-box", "cwd": "/work",
                     "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:01:00+00:00"},
            "HF_TOKEN": HF,
            "argv": ["train.py", "--password", PASSWORD, "--token=" + TOKEN],
            "stderr_tail": f"curl -H 'Authorization: Bearer {TOKEN}' https://x\nexport DB_PASS={PASSWORD}\n"
                           f"git clone https://{TOKEN}@github.com/o/r\n{PRIVATE_KEY_WITHOUT_END}\n",
        },
    }
    (tmp_path / "repro.json").write_text(json.dumps(repro))
    env = dict(PLANTED_ENV, DFLASH_DOCTOR_CACHE=str(tmp_path / "cache"))
    return tmp_path, source, env


def _no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret} leaked:\n{text[max(0, text.find(secret) - 300):][:600]}"


@pytest.mark.parametrize("suffix", ["", ".md", ".html"])
def test_the_bundle_never_carries_a_planted_secret(planted, suffix):
    folder, source, env = planted
    out = ["--out", str(folder / f"report{suffix}")] if suffix else []
    # The scanned folder's name carries a GitHub token: it is on the command line and in the scan section.
    result = run("report", source, "--no-probes", "--repro-json", folder / "repro.json", *out, cwd=folder, env=env,
                 timeout=60)
    assert result.returncode == 0, result
    written = (folder / f"report{suffix}").read_text() if suffix else result.stdout
    _no_secret(written, result.stdout, result.stderr)
    # What the report is for is still there.
    assert "TORCH_LOGS" in written and "recompiles" in written and "reproduced" in written
    assert "hub.example.com" in written and "DFD101" in written
