"""CUDA-graph bookkeeping (``device.graphs``, ``engine.graphs``) on any machine: a
capture stand-in with a graph's semantics (the recorded call reads its own input
tensors at each replay and leaves its results in the same output tensors), the cache's
signatures, and the engine on the sim with graphed model calls: same results as the
plain engine, and the graphs really replay."""

import pytest
import torch

from fake_models import make_model
from overlapcheck import seeds
from overlapcheck.device import make_runtime
from overlapcheck.device.graphs import GraphCache
from overlapcheck.device.sched import make_strategy
from overlapcheck.device.sim import SimRuntime
from overlapcheck.engine import Engine, EngineConfig
from overlapcheck.engine.drafts import DRAFT_KINDS
from overlapcheck.engine.graphs import GraphedModel
from overlapcheck.protocol import generate

from engine_checks import assert_parity

class FakeCapture:
    """``capture(fn, inputs)``: records the call; ``replay`` reruns it on the recorded
    inputs and copies its results into the output tensors handed out at capture."""

    def __init__(self, fail_on=()):
        self.fail_on, self.captures = fail_on, 0

    def __call__(self, fn, inputs):
        if any(isinstance(x, int) and x in self.fail_on for x in inputs):
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        # a capture runs nothing: learn the outputs' shapes on copies, touching no input
        first = fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        if isinstance(first, torch.Tensor):
            outs = first.clone()
        elif isinstance(first, tuple):
            outs = tuple(x.clone() for x in first)
        else:
            outs = first          # None, or what the cache must refuse

        def replay():
            res = fn(*inputs)
            if isinstance(res, torch.Tensor):
                outs.copy_(res)
            elif res is not None:
                for o, r in zip(outs, res):
                    o.copy_(r)
        return replay, outs

def _axpy(kv, x, a):
    """Writes the static ``kv`` (row 0), returns a fresh tensor."""
    kv[0] += x.sum()
    return x * a + kv[0]

def test_warm_up_then_capture_then_replay_with_fresh_inputs():
    kv = torch.zeros(4)
    cap = FakeCapture()
    cache = GraphCache([kv], capture=cap)
    outs = []
    for i in range(4):
        x = torch.full((3,), float(i + 1))
        outs.append(cache.call("axpy", _axpy, kv, x, 2.0))
    assert cap.captures == 1
    assert (cache.stats.eager, cache.stats.captured, cache.stats.replayed) == (1, 1, 3)
    # the write to the static buffer is real; each call saw its own input
    plain = torch.zeros(4)
    want = [_axpy(plain, torch.full((3,), float(i + 1)), 2.0) for i in range(4)]
    assert torch.equal(kv, plain)
    for got, exp in zip(outs, want):
        assert torch.equal(got, exp)   # earlier results not overwritten by later replays

def test_signatures_separate_shapes_values_and_static_addresses():
    kv, other = torch.zeros(4), torch.zeros(4)
    cap = FakeCapture()
    cache = GraphCache([kv, other], capture=cap)
    for _ in range(2):
        cache.call("axpy", _axpy, kv, torch.ones(3), 2.0)
        cache.call("axpy", _axpy, kv, torch.ones(5), 2.0)      # another shape
        cache.call("axpy", _axpy, kv, torch.ones(3), 3.0)      # another value
        cache.call("axpy", _axpy, other, torch.ones(3), 2.0)   # another static buffer
    assert cap.captures == 4 and cache.stats.replayed == 4
    assert kv.tolist() == [2 * (3.0 + 5.0 + 3.0), 0, 0, 0]
    assert other.tolist() == [6.0, 0, 0, 0]

def test_a_dynamic_tensor_is_copied_not_kept_by_address():
    kv = torch.zeros(2)
    cache = GraphCache([kv], capture=FakeCapture())
    x = torch.ones(3)
    cache.call("axpy", _axpy, kv, x, 1.0)
    cache.call("axpy", _axpy, kv, x, 1.0)
    x.fill_(10.0)                                   # the same tensor, new values
    got = cache.call("axpy", _axpy, kv, x, 1.0)
    assert torch.equal(got, torch.full((3,), 10.0 + 36.0))

def _mix(kv, a, b, c):
    """Several dynamic inputs of two dtypes, a tuple of three results."""
    kv[0] += a.sum() + b.sum()
    return a * 2 + kv[0], (b + c).float(), c * 3


def test_several_dynamic_inputs_and_results_are_each_call_own():
    """Dynamic inputs are copied in, and a tuple's results out, together (one launch per
    dtype): each call still sees its own values, and a result stays as it was after
    later replays."""
    kv = torch.zeros(2)
    cap = FakeCapture()
    cache = GraphCache([kv], capture=cap)
    plain = torch.zeros(2)
    got, want = [], []
    for i in range(5):
        args = (torch.full((3,), float(i)), torch.arange(4) + i, torch.arange(4) * i)
        got.append(cache.call("mix", _mix, kv, *args))
        want.append(_mix(plain, *args))
    assert cap.captures == 1 and cache.stats.replayed == 4
    assert torch.equal(kv, plain)
    for g, w in zip(got, want):
        assert type(g) is tuple and len(g) == 3
        for x, y in zip(g, w):
            assert torch.equal(x, y) and x.dtype == y.dtype


def test_uncapturable_calls_stay_eager_and_are_counted():
    kv = torch.zeros(2)
    cache = GraphCache([kv], capture=FakeCapture())
    for _ in range(3):
        cache.call("g", lambda k, xs: k[0] + len(xs), kv, [1, 2])   # a list argument
    assert cache.stats.eager == 3 and cache.stats.captured == cache.stats.failed == 0


def test_a_failed_capture_stops_all_further_captures():
    kv = torch.zeros(2)
    cache = GraphCache([kv], capture=FakeCapture(fail_on=(7,)))
    for _ in range(3):
        cache.call("f", lambda k, n: k[0] + n, kv, 7)
        cache.call("h", lambda k, n: k[0] + n, kv, 8)    # capturable, but after the failure
    assert cache.stats.failed == 1 and cache.stats.captured == 0
    assert cache.stats.eager == 6
    assert "operation not permitted" in cache.stats.errors[0]

def test_no_new_graphs_past_the_cap():
    kv = torch.zeros(2)
    cache = GraphCache([kv], capture=FakeCapture(), max_graphs=2)
    for n in range(4):
        for _ in range(3):
            cache.call("axpy", _axpy, kv, torch.ones(n + 1), 1.0)
    assert cache.graphs == 2 and cache.stats.captured == 2
    assert cache.stats.replayed == 2 * 2 and cache.stats.eager == 2 + 2 * 3

def test_a_graphed_call_must_return_tensors():
    kv = torch.zeros(2)
    cache = GraphCache([kv], capture=FakeCapture())
    for _ in range(3):
        assert cache.call("n", lambda k: 3, kv) == 3
    assert cache.stats.failed == 1 and "must return None or tensors" in cache.stats.errors[0]

class GraphedSim(SimRuntime):
    """The sim with the engine's model calls going through a ``GraphCache`` whose
    captures are ``FakeCapture``s (detector off, as graphs require)."""

    graphs = True

    def __init__(self, seed):
        super().__init__(make_strategy("random", seeds.stream(seed, "schedule")), detect=False)
        self.cache = None

    def graph_cache(self):
        self.cache = GraphCache([b.t for b in self._by_storage.values()
                                 if b.space == "device" and not b.freed], capture=FakeCapture())
        return self.cache

@pytest.mark.parametrize("kind", tuple(DRAFT_KINDS))
@pytest.mark.parametrize("model", ["oracle", "tiny"])
def test_engine_with_graphed_model_calls_matches_the_plain_engine(kind, model, one_thread):
    cfg = EngineConfig(page_size=4, pool_tokens=160, row_width=48, max_running=4, chunk_size=16,
                       draft_kind=kind, model=model)
    wl = generate(3, 8, cfg, max_new=20)
    plain = Engine(cfg, make_runtime("sim", seed=3, strategy="random", detect=False),
                   make_model(model)).run(wl)
    rt = GraphedSim(3)
    eng = Engine(cfg, rt, make_model(model))
    got = eng.run(wl)
    assert isinstance(eng.worker.model, GraphedModel) and eng.worker.model.cache is rt.cache
    assert_parity(plain, got, f"graphed {model}/{kind}")
    st = rt.cache.stats
    assert st.replayed > st.captured > 0 and st.failed == 0, st
    assert eng.idle and eng.mem.is_full()

def test_graphs_need_cuda_and_no_detector():
    with pytest.raises(ValueError, match="need a GPU device"):
        make_runtime("sim", graphs=True)
    assert not make_runtime("sim").graphs
    with pytest.raises(RuntimeError, match="no CUDA graphs"):
        make_runtime("sim").graph_cache()
