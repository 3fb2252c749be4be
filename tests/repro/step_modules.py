"""A trainer's code the way trainers write it, for `repro --step` and `--model --model-compile yours`: one
module-level compiled function called inside an eager step (the backend is Dynamo's `eager`, so no C++ compile:
the compiled-call guard under test is the same)."""
import torch

# The trainer's own compile boundary: only this inner function is compiled.
project = torch.compile(lambda x, w: (x @ w).relu(), backend="eager")


def make_step(device, shape_index):
    w = torch.randn(16, 16, device=device, requires_grad=True)

    def step():
        x = torch.randn(4 * (shape_index + 1), 16, device=device)
        loss = project(x, w).pow(2).mean()
        loss.backward()
        return loss

    return step


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        return project(x, self.w)


def build():
    return Block(), lambda device, shape_index: (torch.randn(4 * (shape_index + 1), 16, device=device),)
