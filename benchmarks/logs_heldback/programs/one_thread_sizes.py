import torch
@torch.compile(backend="eager", dynamic=False)
def scale_sum(x, scale):
    return (x * scale).sum()
for s in range(12):
    scale_sum(torch.randn(s + 1), 2.0)
print("done")
