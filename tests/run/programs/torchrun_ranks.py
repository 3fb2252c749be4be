"""Two ranks under torchrun (gloo, CPU). Rank 1 hits the forced FX-flag leak (a thread inside a blocking
symbolic_trace while another calls a compiled function); rank 0 trains cleanly. Both then meet in a barrier."""
import json
import os
import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
step = torch.compile(lambda x: (x * 2).sum(), backend="eager")
step(torch.ones(3))
outcome = "ok"
if rank == 1:
    entered, release = threading.Event(), threading.Event()

    class BlocksInForward(torch.nn.Module):
        def forward(self, x):
            entered.set()
            release.wait(60)
            return x

    holder = threading.Thread(target=lambda: torch.fx.symbolic_trace(BlocksInForward()), name="fx-holder")
    holder.start()
    entered.wait(60)
    result = {}

    def drafter():
        try:
            step(torch.ones(3))
        except RuntimeError as exc:
            result["error"] = str(exc)[:40]

    worker = threading.Thread(target=drafter, name="drafter-1")
    worker.start()
    worker.join(60)
    release.set()
    holder.join(60)
    outcome = result.get("error", "ok")
dist.barrier()
# one write of the whole line: two ranks share the pipe, and print's text and newline arrived apart once
# ('{"rank": 1, ...}{"rank": 0, ...}' on one line)
os.write(1, (json.dumps({"rank": rank, "outcome": outcome}) + "\n").encode())
dist.destroy_process_group()
