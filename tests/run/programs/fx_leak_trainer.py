"""A small threaded trainer with the forced FX-flag leak (docs/races.md, "Reproductions"): a compiled training
step warmed up in the main thread, then a `fx-holder` thread inside a real torch.fx.symbolic_trace whose forward
blocks on an event while a `drafter-0` thread keeps stepping. It never imports dflash_doctor. It prints one JSON
line: each thread's outcome. Exit 0 whatever happened (the report is the tool's business).

The step calls no nn.Module and compiles with Dynamo's eager backend (which calls the graph's forward, not the
module): while another thread traces, every nn.Module call in any thread goes through the tracer's patched
__call__ and raises NameError (the patcher race, docs/races.md), which threadlocal-flag does not cover."""
import json
import sys
import threading

import torch

weight = torch.randn(8, 8, requires_grad=True)
step = torch.compile(lambda x: (x @ weight).pow(2).mean(), backend="eager")
entered, release = threading.Event(), threading.Event()
outcome = {}


class BlocksInForward(torch.nn.Module):
    def forward(self, x):
        entered.set()
        release.wait(60)
        return x


def hold_the_flag():
    torch.fx.symbolic_trace(BlocksInForward())


def drafter():
    try:
        for _ in range(3):
            step(torch.randn(4, 8)).backward()
        outcome["drafter-0"] = "ok"
    except RuntimeError as exc:
        outcome["drafter-0"] = f"error: {str(exc)[:60]}"


step(torch.randn(4, 8)).backward()  # compiled once, alone
holder = threading.Thread(target=hold_the_flag, name="fx-holder")
holder.start()
entered.wait(60)
worker = threading.Thread(target=drafter, name="drafter-0")
worker.start()
worker.join(60)
release.set()
holder.join(60)
print(json.dumps(outcome))
sys.exit(0)
