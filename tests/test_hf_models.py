"""The HF-family loader and decoder on CPU: a tiny HF-format directory written here
loads, matches a dense reference forward, is bitwise batch invariant; bad directories
are one-line ``ModelError``s and ``overlapcheck run --model hf:DIR`` exits 2."""
import os
import subprocess
import sys

import pytest
import torch

from fake_models import make_model
from fake_models.hf import ModelError, from_dir, random_pair
from fake_models.hf import config as C
from overlapcheck.engine import EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS

from engine_checks import check_parity_and_lossless
from hf_fixtures import Paged, reference_logits, write_dir


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(params=["tree", "exact"])
def linear_path(request, monkeypatch):
    """Every weight through the tree (the tiny sizes' path), or through ``ExactWeight``
    (the real sizes' path), whatever its size."""
    from fake_models.hf import ops
    if request.param == "exact":
        monkeypatch.setattr(ops, "TREE_LIMIT", 0)
    return request.param


@pytest.mark.parametrize("size", ["tiny-qwen3", "tiny-llama"])
def test_logits_match_dense_reference(tmp_path, size, linear_path):
    cfg, t = write_dir(tmp_path, size)
    model = make_model(f"hf:{tmp_path}")
    toks = [5, 17, 3, 60, 2, 2, 41, 9, 33, 12, 0, 63]
    pg = Paged(model, 1)
    pg.write([(0, 0, toks)])
    got = pg.logits([0] * len(toks), list(range(1, len(toks) + 1)))
    ref = reference_logits(cfg, t, toks)
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-4), (got - ref).abs().max()


def test_qwen2_biases_and_untied_head(tmp_path):
    doc = dict(C.SIZES["tiny-llama"][0].to_json(), architectures=["Qwen2ForCausalLM"])
    cfg = C.parse(doc)
    assert cfg.attention_bias and not cfg.qk_norm and not cfg.tie_word_embeddings
    from fake_models.hf import weights as Wt
    t = Wt.random_init(cfg, 1, "qwen2")
    Wt.save(str(tmp_path), cfg, t)
    model = from_dir(str(tmp_path))
    toks = [1, 2, 3, 4, 5, 6, 7]
    pg = Paged(model, 1)
    pg.write([(0, 0, toks)])
    got = pg.logits([0] * 7, list(range(1, 8)))
    assert torch.allclose(got, reference_logits(cfg, t, toks), atol=2e-4, rtol=1e-4)


def test_batch_invariant_bitwise(tmp_path, linear_path):
    """A request alone in one prefill == the same request among 8, chunked differently."""
    write_dir(tmp_path)
    model = make_model(f"hf:{tmp_path}")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 30, (8,), generator=g)]
    alone = []
    for p in prompts:
        pg = Paged(model, 1)
        pg.write([(0, 0, p)])
        alone.append(pg.logits([0], [len(p)]))
    pg = Paged(model, 8)
    done = [0] * 8
    step = 0
    while any(done[r] < len(p) for r, p in enumerate(prompts)):
        items = []
        for r, p in enumerate(prompts):
            n = (r + step) % 5 + 1
            if done[r] < len(p):
                items.append((r, done[r], p[done[r]:done[r] + n]))
                done[r] += len(items[-1][2])
        pg.write(items)
        step += 1
    batch = pg.logits(list(range(8)), [len(p) for p in prompts])
    for r in range(8):
        assert torch.equal(batch[r], alone[r][0]), f"request {r} not bitwise equal"


@pytest.mark.parametrize("din,dout", [(2048, 512), (8192, 256), (300, 70)])
def test_exact_weight_is_exact_and_close(din, dout):
    """Every partial sum of the float64 product is an integer below 2**52: the product
    equals the int64 one, a row alone equals the row in a batch, and the result is
    within a few 1e-6 of the dense float64 product."""
    from fake_models.hf.ops import ExactWeight
    g = torch.Generator().manual_seed(din)
    w = torch.randn(din, dout, generator=g) * din ** -0.5
    x = torch.randn(24, din, generator=g) * torch.logspace(-3, 3, 24).unsqueeze(1)
    e = ExactWeight(w)
    assert torch.equal(e.q, e.q.round()) and e.q.abs().max() <= 2 ** (52 - (din - 1).bit_length() - e.xbits)
    assert (e.scale.log2() == e.scale.log2().round()).all()
    y = e(x)
    assert torch.equal(torch.cat([e(x[i:i + 1]) for i in range(24)]), y)
    assert torch.equal(e(x[3:11]), y[3:11])
    ref = x.double() @ w.double()
    rel = ((y.double() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
    assert rel < 1e-5, rel
    # the float64 matmul of the integer grids equals the exact int64 one
    from fake_models.hf.ops import _pow2_grid
    s = _pow2_grid(x.double().abs().amax(-1, keepdim=True), e.xbits)
    qx = torch.round(x.double() / s)
    assert torch.equal((qx @ e.q), (qx.long() @ e.q.long()).double())


def test_random_sizes_are_lazy():
    m = random_pair("qwen3-0.6b")
    assert m.tdec._cpu is None and m.kv_width == 3 + 2 * 8 * 128 * 28
    assert C.SIZES["qwen3-0.6b"][0].params() == pytest.approx(0.6e9, rel=0.1)
    assert C.SIZES["llama-1b"][0].params() == pytest.approx(1.24e9, rel=0.05)


def _break(kind):
    def drop(t):
        del t["model.layers.1.mlp.up_proj.weight"]

    def shape(t):
        t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 32)

    def arch(doc):
        doc["architectures"] = ["MixtralForCausalLM"]

    return {"missing": (drop, None, "missing tensor 'model.layers.1.mlp.up_proj.weight'"),
            "shape": (shape, None, "'model.layers.0.self_attn.k_proj.weight' has shape (3, 32)"),
            "arch": (None, arch, "unsupported architecture ['MixtralForCausalLM']")}[kind]


@pytest.mark.parametrize("kind", ["missing", "shape", "arch", "garbage", "nodir"])
def test_bad_dirs_are_one_line_errors(tmp_path, kind):
    path = tmp_path / "m"
    if kind == "garbage":
        os.makedirs(path)
        (path / "config.json").write_text("{not json")
        want = "cannot read JSON"
    elif kind == "nodir":
        want = "no such model directory"
    else:
        edit, cfg_edit, want = _break(kind)
        write_dir(path, edit=edit, cfg_edit=cfg_edit)
    with pytest.raises(ModelError) as e:
        make_model(f"hf:{path}")
    assert want in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_dir_exits_2(tmp_path):
    edit, _, want = _break("missing")
    write_dir(tmp_path, edit=edit)
    p = subprocess.run([sys.executable, "-m", "overlapcheck", "run", "--model", f"hf:{tmp_path}",
                        "--requests", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert want in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_config_names():
    for ok in ("oracle", "tiny", "trained", "hf:/x", "random:qwen3-0.6b"):
        EngineConfig(model=ok)
    for bad in ("hf:", "random:", "llama", 3):
        with pytest.raises(ValueError):
            EngineConfig(model=bad)
    with pytest.raises(ModelError, match="unknown random size"):
        make_model("random:nope")
    with pytest.raises(ModelError, match="rope_scaling"):
        C.parse(dict(C.SIZES["tiny-llama"][0].to_json(), rope_scaling={"type": "yarn"}))


@pytest.mark.parametrize("kind", tuple(DRAFT_KINDS))
def test_small_hf_parity_and_lossless(tmp_path, kind):
    """overlap == non-overlap per request (tokens and accept lengths), spec == no-spec."""
    from overlapcheck.protocol import generate
    write_dir(tmp_path / "target", "tiny-qwen3", 0)
    write_dir(tmp_path / "draft", "tiny-qwen3", 1)
    model = make_model(f"hf:{tmp_path}")
    seed = KINDS.index(kind)
    base = dict(model=f"hf:{tmp_path}", draft_kind=kind, spec_steps=3, row_width=48,
                pool_tokens=(96, 512, 160)[seed], page_size=(1, 4, 2)[seed], max_running=5,
                chunk_size=8)
    wl = generate(seed, 8, EngineConfig(**base), max_new=20)
    check_parity_and_lossless(base, wl, seed, model)


KINDS = tuple(DRAFT_KINDS)


def test_the_cpu_runs_the_exact_path_and_its_references_stay_on_the_cpu():
    """Off a GPU the decoder takes the exact kernels, the model says it is exact there,
    and the reference target keeps parity's reference run and the golden model on the
    sim and the CPU (a GPU with Triton moves them to the run's device:
    tests/test_hf_kernels_gpu.py)."""
    from fake_models.golden import exact_on, shared
    from fake_models.hf import kernels, ops
    from overlapcheck import targets
    from overlapcheck.engine import EngineConfig
    assert kernels.for_device("cpu") is ops and kernels.exact_on("cpu")
    m = make_model("random:tiny-qwen3")
    assert m.exact_on("cpu") and exact_on(m, "cpu") and exact_on("oracle", "cuda")
    cfg = EngineConfig(model="random:tiny-qwen3")
    ref = targets.get("reference")
    assert ref.reference_device(cfg, "sim") is None
    assert ref.checker_context(cfg)["model_golden"] is shared("random:tiny-qwen3", cfg.row_width)
    assert ref.checker_context(cfg)["model_golden"].device == "cpu"
