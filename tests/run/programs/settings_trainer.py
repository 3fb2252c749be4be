"""A trainer that switches the non-lazy backward in its main thread, the way most trainers set compile config,
then trains in worker threads: a plain thread and a ThreadPoolExecutor worker. Its aot_autograd backend records
when each thread's forward and backward graphs are compiled, and it prints, per thread, the order of those compiles
against the moment its forward call returned. `python settings_trainer.py main` assigns the switch in main;
`none` leaves it alone (for `run --fix non-lazy-backward`)."""
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch._functorch.config as functorch_config
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

order = {}


def recording(kind):
    def compile_graph(gm, example_inputs):
        order.setdefault(threading.current_thread().name, []).append(kind)
        return make_boxed_func(gm.forward)
    return compile_graph


model = torch.compile(lambda x: (x.sin() * 2).sum(), dynamic=False,
                      backend=aot_autograd(fw_compiler=recording("fw"), bw_compiler=recording("bw")))


def train(size):
    loss = model(torch.randn(size, requires_grad=True))
    order.setdefault(threading.current_thread().name, []).append("forward-returned")
    loss.backward()
    return functorch_config.force_non_lazy_backward_lowering


if sys.argv[1:] == ["main"]:
    functorch_config.force_non_lazy_backward_lowering = True
reads = {}
trained, stop = threading.Event(), threading.Event()


def drafter():
    reads["drafter-0"] = train(6)
    trained.set()
    stop.wait(60)  # alive while the pool worker trains, as a trainer's workers are


worker = threading.Thread(target=drafter, name="drafter-0")
worker.start()
trained.wait(60)
with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
    reads["pool_0"] = pool.submit(train, 10).result()
stop.set()
worker.join()
print(json.dumps({"order": order, "reads": reads}))
