"""A TorchFunctionMode that records the functions it sees (tests of the calls torch function
handling must see: they go through the op's packet or torch's function)."""

from torch.overrides import TorchFunctionMode


class Recording(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(func)
        return func(*args, **(kwargs or {}))
