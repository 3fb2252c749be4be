"""A trainer's step in two parts, as many are written: an eager block (norm and projection) feeding a compiled
function. Two races can reach it: a trace beside it patches nn.Module for every thread (the eager block raises
NameError: the patcher race), and the FX flag left up makes the compiled call raise (the FX-flag leak, the stuck
flag)."""
import torch

project = torch.compile(lambda x, w: (x @ w).relu(), backend="eager")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(self.norm(x))


def make_step(device, shape_index):
    block = Block().to(device)
    w = torch.randn(16, 16, device=device, requires_grad=True)

    def step():
        x = block(torch.randn(4 * (shape_index + 1), 16, device=device))
        loss = project(x, w).pow(2).mean()
        loss.backward()
        return loss

    return step
