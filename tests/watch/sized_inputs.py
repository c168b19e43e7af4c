"""The small device inputs the tests of ops with a data-dependent output size share
(``test_watch_sizes.py`` on the shim and a GPU, ``test_watch_sizes_gpu.py`` against the
CUDA runtime calls)."""
import torch


def ids():
    return torch.tensor([1, 0, 2, 0, 3], device="cuda")


def mask():
    return torch.tensor([True, False, True, True], device="cuda")


def rows():
    return torch.arange(8.0, device="cuda").reshape(4, 2)


def ngrams():
    return torch.tensor([[3, 4], [5, 6], [3, 4]], device="cuda")
