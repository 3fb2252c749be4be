"""Two worker threads training a small eager model (no torch.compile, no torch.fx of their own): the kind of run in
which the FX patcher race can only come from a thread that traces, here the tool's --amplify foreign-trace."""
import threading

import torch
import torch.nn.functional as F

errors = []


def train(rank: int, steps: int = 300) -> None:
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = F.mse_loss(model(torch.randn(8, 16)), torch.zeros(8, 4))
        opt.zero_grad()
        loss.backward()
        opt.step()


workers = [threading.Thread(target=train, args=(rank,), name=f"worker-{rank}") for rank in range(2)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
