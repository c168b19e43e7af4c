"""The real sizes' linear layer (``ExactWeight``) on a CUDA device (skipped without one):
exact, so a row alone equals the row in any batch, and the GPU's bits equal the CPU's."""
import pytest
import torch

from fake_models.hf.ops import ExactWeight

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("din,dout", [(2048, 8192), (8192, 2048)])
def test_exact_weight_on_gpu_equals_cpu_and_is_batch_invariant(din, dout):
    g = torch.Generator().manual_seed(din)
    w = torch.randn(din, dout, generator=g) * din ** -0.5
    x = torch.randn(40, din, generator=g)
    cpu = ExactWeight(w)(x)
    e = ExactWeight(w.cuda())
    y = e(x.cuda())
    assert torch.equal(y.cpu(), cpu)
    for n in (1, 3, 8):
        assert torch.equal(torch.cat([e(x[i:i + n].cuda()) for i in range(0, 40, n)][:40 // n]),
                           y[:40 // n * n])
