"""The kernels' array namespace (device/xp.py): each operation means on numpy what it
means on torch, refusals included, so a kernel written once computes the same on the
sim's numpy views and on a GPU's tensors."""
import numpy as np
import pytest
import torch

from overlapcheck.device.xp import NUMPY, TORCH, NoHostModel, of, one_source


def _same(a, b):
    b = b.numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert isinstance(a, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype, (a, b)
    assert (a == b).all(), (a, b)


def _both(fn):
    """``fn(xp, arrays)`` on numpy and on torch; both raise, or both give the same."""
    try:
        want = fn(TORCH, torch.from_numpy)
    except (IndexError, RuntimeError):
        with pytest.raises(IndexError):
            fn(NUMPY, lambda a: a)
        return False
    _same(fn(NUMPY, lambda a: a), want)
    return True


def test_of_names_the_namespace_of_an_array():
    assert of(np.zeros(2)) is NUMPY and of(torch.zeros(2)) is TORCH


def test_each_operation_means_the_same_on_both():
    rng = np.random.default_rng(0)
    ran = refused = 0
    for _ in range(300):
        x = rng.integers(-2 ** 62, 2 ** 62, (int(rng.integers(1, 5)), int(rng.integers(1, 6))))
        b, w = x.shape
        idx = rng.integers(-1 if rng.random() < 0.2 else 0, w + (rng.random() < 0.2),
                           (int(rng.integers(1, b + 1)), int(rng.integers(1, 4))))
        c = rng.random(x.shape) < 0.5
        k, lo, hi = int(rng.integers(1, 4)), int(rng.integers(-5, 1)), int(rng.integers(0, 5))
        for fn in (lambda xp, t: xp.where(t(c), t(x), -1),
                   lambda xp, t: xp.where(t(c), 0, t(x)),
                   lambda xp, t: xp.long(t(c)),
                   lambda xp, t: xp.cast(t(c), t(x)),
                   lambda xp, t: xp.cumprod(xp.long(t(c)), 1).sum(1),
                   lambda xp, t: xp.clamp(t(x) % 7, lo, hi),
                   lambda xp, t: xp.clamp(t(x) % 7, None, hi),
                   lambda xp, t: xp.clamp(t(x) % 7, lo),
                   lambda xp, t: xp.expand(t(x)[:, :1], (b, w)).reshape(-1),
                   lambda xp, t: xp.repeat_each(t(x)[:, 0], k),
                   lambda xp, t: xp.gather(t(x), 1, t(idx)),
                   lambda xp, t: xp.gather(t(x)[None], 2, t(idx)[None]),
                   lambda xp, t: xp.arange(w, t(x)) + t(x)[0],
                   lambda xp, t: xp.zeros((b, k), t(x)) + xp.ones_like(t(x))[:, :1],
                   lambda xp, t: (t(x) * 3 + 1) % 97 + t(x) // 5,      # wraps, floors
                   lambda xp, t: xp.long(t(c)).argmax(1) + t(c).any(1)):
            if _both(fn):
                ran += 1
            else:
                refused += 1
    assert ran > 3000 and refused > 50


def test_a_store_with_duplicate_indices_keeps_the_last_writer_on_both():
    for new in (np.array, torch.tensor):
        dst = new([0, 0, 0, 0])
        dst[new([1, 2, 1])] = new([5, 6, 7])
        assert dst.tolist() == [0, 7, 6, 0]


def test_the_model_is_its_host_mirror_on_numpy_and_itself_on_torch():
    from fake_models import make_model
    oracle, tiny = make_model("oracle"), make_model("tiny")
    assert TORCH.model(oracle) is oracle and NUMPY.model(oracle) is oracle.host
    head = oracle.head("eagle")
    assert NUMPY.model(head) is head.host and NUMPY.model(head).out == oracle.host.eagle_out
    with pytest.raises(NoHostModel):
        NUMPY.model(tiny)


def test_one_source_marks_a_kernel_as_its_own_host_run():
    @one_source
    def kernel(a, b):
        a[:b] = of(a).where(a[:b] > 0, a[:b], 0)

    assert kernel.host_run is kernel and kernel.one_source
    t = torch.tensor([-1, 2, -3])
    n = t.numpy().copy()
    kernel(t, 2)
    kernel(n, 2)
    assert t.tolist() == n.tolist() == [0, 2, -3]
