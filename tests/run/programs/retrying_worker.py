"""A worker that survives one error and dies of the next (no dflash_doctor import). Its monitor thread inspects
the model with torch.fx twice; the first time, the worker's compiled step meets the FX flag and raises the
FX-tracing RuntimeError, which the worker logs and retries past; the second time, its plain nn.Linear call meets
the tracer's patches (NameError) and the worker dies. Two different errors in one thread: both are the user's to
see. Exit 0 (the trainer only logs)."""
import logging
import threading

import torch
import torch.fx

logging.basicConfig(level=logging.INFO, format="%(threadName)s %(message)s")
log = logging.getLogger("trainer")
weight = torch.randn(4, 4)
step = torch.compile(lambda x: (x @ weight).sum(), backend="eager")
tracing, worker_done = threading.Event(), threading.Event()


class Probe(torch.nn.Module):
    def forward(self, x):
        tracing.set()
        worker_done.wait(5)
        return x


def monitor(rounds, go):
    for round_ in range(rounds):
        go[round_].wait(20)
        tracing.clear()
        worker_done.clear()
        torch.fx.symbolic_trace(Probe())


def work(go):
    go[0].set()
    tracing.wait(20)
    try:
        step(torch.zeros(2, 4))
    except RuntimeError as exc:
        log.info("step failed, retrying later: %s", str(exc)[:60])
    worker_done.set()
    go[1].set()
    tracing.wait(20)
    while not tracing.is_set():
        pass
    torch.nn.Linear(4, 4)(torch.zeros(2, 4))  # inside the second trace: dies here
    worker_done.set()


step(torch.zeros(2, 4))  # compiled once, alone
go = [threading.Event(), threading.Event()]
threads = [threading.Thread(target=monitor, args=(2, go), name="graph-inspector"),
           threading.Thread(target=work, args=(go,), name="worker-0")]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
log.info("finished")
