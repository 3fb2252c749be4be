"""A small MLP for `repro --model tests.repro.mlp_factory:build` on the CPU: forward and backward compiled by the
whole-module wrapper, a batch size per shape index so threads with different indices compile different graphs."""


def build():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    def inputs(device, shape_index):
        return (torch.randn(2 + shape_index, 16, device=device),)

    return model, inputs
