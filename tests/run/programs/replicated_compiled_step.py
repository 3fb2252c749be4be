"""nn.DataParallel over a compiled model, the way a trainer writes it, on a machine without an accelerator:
nn.DataParallel(torch.compile(model)) replicates the compiled wrapper for every device each step
(torch.nn.parallel.replicate calls `_replicate_for_data_parallel` on it) and runs each replica in a parallel_apply
thread. Only the accelerator calls parallel_apply makes are CPU stand-ins (`cpu_as_accelerator`); the replicas,
their threads and the error handling are torch's own. The trainer catches the re-raised error for 3 steps and
exits 0, as a trainer that logs and skips a bad step does."""
import contextlib
import sys

import torch
from torch.nn.parallel import parallel_apply


class CpuStream(contextlib.nullcontext):
    device = torch.device("cpu")  # Dynamo reads the current stream's device when it starts a trace


def cpu_as_accelerator():
    torch.accelerator.is_available = lambda: True
    torch.accelerator.current_accelerator = lambda *args, **kwargs: torch.device("cpu")
    torch.accelerator.current_stream = lambda device=None: CpuStream()
    torch.accelerator.device_index = lambda device: contextlib.nullcontext()


class MLP(torch.nn.Module):
    def __init__(self, width=16, depth=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


def main():
    cpu_as_accelerator()
    model = torch.compile(MLP(), backend="eager")
    for step in range(3):
        replicas = [model._replicate_for_data_parallel() for _ in range(2)]  # what replicate() does per device
        try:
            outputs = parallel_apply(replicas, [torch.randn(4, 16), torch.randn(4, 16)])
            print("step", step, "loss", sum(out.pow(2).mean() for out in outputs).item())
        except AttributeError as exc:
            if "--raise" in sys.argv:
                raise  # a trainer that does not catch it: the main thread dies of DataParallel's re-raise
            print(f"step {step} skipped: {exc}", file=sys.stderr)
    print("done", flush=True)


if __name__ == "__main__":
    main()
