"""dflash-doctor: diagnose torch.compile thread races in multi-threaded, multi-GPU PyTorch training."""

__version__ = "0.1.0"
TOOL_NAME = "dflash-doctor"
