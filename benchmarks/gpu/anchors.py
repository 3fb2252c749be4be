"""The anchors of one device call, each in a fresh interpreter, as JSON on stdout: `import torch` (twice: the
first read of its libraries and a second), `import torch._dynamo` after it, and what making a compiled function
costs and touches (`torch.compile(fn)`, never called): its seconds, whether CUDA (torch's or the driver's) was
initialised by it, and whether it started a thread. The warm-start server (dflash_doctor/repro/warm_start.py)
makes that compiled function only where it touches nothing a fork would lose.

    python3 benchmarks/gpu/anchors.py > anchors.json
"""
from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import json, threading, time
t = time.perf_counter(); import torch; torch_s = time.perf_counter() - t
t = time.perf_counter(); import torch._dynamo; dynamo_s = time.perf_counter() - t
from dflash_doctor.repro.warm_start import cuda_driver_initialised
t = time.perf_counter(); torch.compile(lambda x: x, dynamic=False); wrapper_s = time.perf_counter() - t
print(json.dumps({"import_torch_s": round(torch_s, 3), "import_dynamo_s": round(dynamo_s, 3),
                  "compile_wrapper_s": round(wrapper_s, 3), "torch_cuda_initialised": torch.cuda.is_initialized(),
                  "driver_initialised": cuda_driver_initialised(), "threads": threading.active_count(),
                  "torch": torch.__version__}))
"""


def main() -> int:
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-2000:])
            return 1
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(json.dumps({"first": runs[0], "second": runs[1]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
