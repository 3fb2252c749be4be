"""On one GPU (torch 2.11+cu130, H100): what `dflash-doctor logs` reads from the real stderr of nn.DataParallel over a
compiled model with replicas on device 0 repeated (issue 38: DFD519 names the replica; the fixture in
fixtures/logs/records/ is written in ExceptionWrapper's layout, this checks it against the real output).

    python benchmarks/gpu/logs_dataparallel.py OUT_DIR

Writes OUT_DIR/dataparallel.stderr (the failing form's own output) and OUT_DIR/logs.json (`logs -f json` on it), and
prints the codes and workers found. Exit 0 when the failure reproduced and DFD519 names replica N; 1 otherwise.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FAILING_FORM = r"""
import torch
from torch import nn
model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(4)]).cuda()
dp = nn.DataParallel(torch.compile(model), device_ids=[0, 0, 0])
for step in range(3):
    loss = dp(torch.randn(24, 512, device="cuda")).pow(2).mean()
    loss.backward()
    print(f"step={step} loss={loss.item():.4f}", flush=True)
"""


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([sys.executable, "-c", FAILING_FORM], capture_output=True, text=True, timeout=600)
    (out / "dataparallel.stderr").write_text(run.stdout + run.stderr)
    logs = subprocess.run([sys.executable, "-m", "dflash_doctor", "logs", str(out / "dataparallel.stderr"), "-f", "json"],
                          capture_output=True, text=True, timeout=120)
    (out / "logs.json").write_text(logs.stdout)
    found = [(f["code"], f["evidence"].get("thread")) for f in json.loads(logs.stdout)["findings"]]
    print(f"form exit {run.returncode}; logs found {found}")
    return 0 if run.returncode != 0 and any(c == "DFD519" and str(t).startswith("replica ") for c, t in found) else 1


if __name__ == "__main__":
    raise SystemExit(main())
