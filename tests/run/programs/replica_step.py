"""A data-parallel step run the way nn.DataParallel runs it: torch.nn.parallel.parallel_apply, one thread per
replica. This machine has no accelerator, so only the device calls parallel_apply makes (torch.accelerator's stream,
device index and availability) are stood in for by CPU no-ops in `cpu_as_accelerator`; the replica threads, the
modules and the error handling are torch's own. Replica 1's batch lacks its labels: its forward raises KeyError,
parallel_apply re-raises it in the caller, and the trainer catches it, logs it and goes on (exit 0)."""
import contextlib
import sys

import torch
from torch.nn.parallel import parallel_apply


def cpu_as_accelerator():
    torch.accelerator.is_available = lambda: True
    torch.accelerator.current_accelerator = lambda *args, **kwargs: torch.device("cpu")
    torch.accelerator.current_stream = lambda device=None: contextlib.nullcontext()
    torch.accelerator.device_index = lambda device: contextlib.nullcontext()


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(8, 2)

    def forward(self, batch):
        logits = self.head(batch["features"])
        return torch.nn.functional.cross_entropy(logits, batch["labels"])


def main():
    cpu_as_accelerator()
    replicas = [Scorer(), Scorer()]
    batches = [{"features": torch.randn(4, 8), "labels": torch.tensor([0, 1, 0, 1])},
               {"features": torch.randn(4, 8)}]
    try:
        losses = parallel_apply(replicas, batches)
        print("losses", [round(loss.item(), 3) for loss in losses])
    except KeyError as exc:
        print(f"step skipped: {exc}", file=sys.stderr)
    print("done", flush=True)


if __name__ == "__main__":
    main()
