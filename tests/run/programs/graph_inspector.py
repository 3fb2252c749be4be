"""A trainer whose monitor thread inspects the model with torch.fx while a worker trains (no dflash_doctor import).
Its threads' deaths go to its own logger: threading.excepthook is replaced, as many trainers do.

The monitor traces a module whose forward waits, so the worker's eager module call lands inside the trace every
time: the FX patcher race, deterministically. `--die` instead makes the worker die of a KeyError (no tracing).
Exits 0 either way: the trainer only logs what killed its worker."""
import logging
import sys
import threading

import torch
import torch.fx

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(message)s")
log = logging.getLogger("trainer")
threading.excepthook = lambda args: log.error("Exception in thread %s: %s: %s", args.thread.name,
                                              args.exc_type.__name__, args.exc_value)
inside, done = threading.Event(), threading.Event()


class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 4)

    def forward(self, x):
        inside.set()
        done.wait(0.5)  # the worker sets it once its call went through; a worker that died never does
        return self.head(x)


def monitor():
    graph = torch.fx.symbolic_trace(Probe())
    log.info("monitor: %d nodes", len(graph.graph.nodes))


def train():
    if sys.argv[1:] == ["--die"]:
        batch = {}
        batch["input_ids"]
    inside.wait(20)
    torch.nn.Linear(4, 4)(torch.zeros(2, 4))
    log.info("worker: step=1")
    done.set()


threads = [threading.Thread(target=train, name="worker-0")]
if sys.argv[1:] != ["--die"]:
    threads.append(threading.Thread(target=monitor, name="graph-inspector"))
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
log.info("finished")
