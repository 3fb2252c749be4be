import logging, sys, threading
import torch
torch._logging.set_logs(recompiles=True)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
if len(sys.argv) > 2:
    torch._dynamo.config.recompile_limit = int(sys.argv[2])
    print(f"set torch._dynamo.config.recompile_limit = {sys.argv[2]}", flush=True)
@torch.compile(backend="eager")
def step(x, scale):
    return (x * scale).sin().sum()
errors = []
def worker(i):
    try:
        for k in range(3):
            step(torch.randn(4 + i % 3, 8), float(i))
    except Exception as exc:
        errors.append(exc)
        logging.exception("worker %d failed", i)
ths = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
for t in ths: t.start()
for t in ths: t.join()
print(f"Worker errors observed: {len(errors)}/{n} threads failed")
