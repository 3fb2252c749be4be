"""Two user models for `repro --model` on the GPU, written the way a user's would be, neither a drafter: what the
speed issue's "repro --model pkg:factory" row times (benchmarks/gpu/speed_h200.sh).

    python3 -m dflash_doctor repro --device cuda --model benchmarks.gpu.user_models:mlp
    python3 -m dflash_doctor repro --device cuda --model benchmarks.gpu.user_models:attention
"""
import torch
import torch.nn.functional as F


class ResidualMLP(torch.nn.Module):
    """A pre-norm residual MLP stack: the harness compiles it whole."""

    def __init__(self, width=512, depth=4):
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(width) for _ in range(depth))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(width, 4 * width) for _ in range(depth))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(4 * width, width) for _ in range(depth))

    def forward(self, x):
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            x = x + down(F.gelu(up(norm(x))))
        return x


class Block(torch.nn.Module):
    """One causal self-attention block over SDPA, with its MLP."""

    def __init__(self, width=256, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


def mlp():
    return ResidualMLP(), lambda device, shape_index: (torch.randn(64 * (shape_index + 1), 512, device=device),)


def attention():
    return Block(), lambda device, shape_index: (torch.randn(4, 128 * (shape_index + 1), 256, device=device),)
