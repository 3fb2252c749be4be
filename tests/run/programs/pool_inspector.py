"""A trainer whose steps run in a ThreadPoolExecutor while its main thread inspects the graph with a Tracer
subclass; the step's error comes back through future.result() and ends the process (no dflash_doctor import).
The step waits until the trace is inside the traced forward, so its module call meets the patches every time."""
import concurrent.futures as cf
import threading

import torch
import torch.fx

inside, done = threading.Event(), threading.Event()


class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x):
        inside.set()
        done.wait(0.5)
        return self.head(x)


def step():
    inside.wait(20)
    return torch.nn.Linear(4, 4)(torch.zeros(2, 4)).sum().item()


with cf.ThreadPoolExecutor(max_workers=1) as pool:
    future = pool.submit(step)
    torch.fx.Tracer().trace(Probe())
    print("loss", future.result())
