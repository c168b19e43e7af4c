"""CUDA graphs for repeated device calls (the ``cuda`` backend, ``graphs=True``).

A decode step of the fake models is a few thousand small kernels. Launched one by one,
they keep the host busy far longer than the GPU runs them, and no schedule can overlap
host work that *is* the launch: overlap then only adds its own bookkeeping. Engines
capture each decode shape once in a CUDA graph and replay it; ``GraphCache.call`` does
that for one callable:

* a call's *signature* is its name and, per argument, one of: a *static* tensor (its
  storage is one of the long-lived buffers the cache was given: by address and
  geometry), a *dynamic* tensor (by shape, dtype and device: its values are copied into
  the graph's own input tensor before each replay), or a plain value (int, float, bool,
  str, None: by value). An argument of any other type makes the call eager;
* the first call of a signature runs eagerly (the warm-up: weights reach the device,
  kernels load); the second captures a graph on a side stream and replays it on the
  caller's stream; later calls replay. Capture runs nothing and syncs nothing;
* outputs (None, a tensor, or a tuple or list of tensors) are cloned after the replay,
  so the next replay cannot overwrite a result still in use;
* a call whose outputs are not tensors runs eagerly from then on; after a capture that
  fails (its error is kept in ``stats``) and once ``max_graphs`` are held, every new
  signature does. Captures run with Python's garbage collector paused: freeing a dead
  object's device or pinned memory inside a capture invalidates it.

The contract of a graphed callable: it writes only to its static arguments (a KV
buffer), its control flow does not depend on tensor values, and it allocates nothing
outside the call. The engine's model interface keeps it.

The capture itself is a parameter (``capture(fn, inputs) -> (replay, outputs)``), so the
bookkeeping is tested on any machine; ``cuda_capture`` is the real one.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

PLAIN = (int, float, bool, str, type(None))
Capture = Callable[[Callable, List[Any]], Tuple[Callable[[], None], Any]]


@dataclass
class GraphStats:
    """How the calls went: eager (warm-up, uncapturable or over the cap), captures,
    replays and failed captures (with the first error)."""
    eager: int = 0
    captured: int = 0
    replayed: int = 0
    failed: int = 0
    errors: List[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"eager": self.eager, "captured": self.captured, "replayed": self.replayed,
                "failed": self.failed, "errors": self.errors[:3]}


class _Graph:
    __slots__ = ("replay", "inputs", "dynamic", "outputs")

    def __init__(self, replay, inputs, dynamic, outputs):
        self.replay, self.inputs, self.dynamic, self.outputs = replay, inputs, dynamic, outputs


class GraphCache:
    """Graphs of ``fn`` calls keyed by signature; ``static``: the long-lived tensors
    (KV buffers, tables) graphs may read and write by address."""

    def __init__(self, static: Iterable[torch.Tensor], capture: Optional[Capture] = None,
                 max_graphs: int = 64):
        self.static = {t.untyped_storage().data_ptr() for t in static}
        self._capture = capture if capture is not None else cuda_capture()
        self.max_graphs = max_graphs
        self._seen: Dict[tuple, Any] = {}   # signature -> "warm" | _Graph | None (eager)
        self._dev: Optional[int] = None     # the CUDA device, once it is initialized
        self.graphs = 0
        self.stats = GraphStats()

    def _signature(self, name: str, flat: List[Any]) -> Optional[Tuple[tuple, List[int]]]:
        key: List[Any] = [name]
        dynamic: List[int] = []
        for i, a in enumerate(flat):
            if isinstance(a, torch.Tensor):
                if a.untyped_storage().data_ptr() in self.static:
                    key.append(("S", a.data_ptr(), tuple(a.shape), a.stride(), a.dtype))
                else:
                    key.append(("D", tuple(a.shape), a.dtype, a.device))
                    dynamic.append(i)
            elif isinstance(a, PLAIN):
                key.append(("V", type(a).__name__, a))
            else:
                return None
        if self._dev is None and torch.cuda.is_available() and torch.cuda.is_initialized():
            self._dev = torch.cuda.current_device()
        key.append(_stream_key(self._dev))
        return tuple(key), dynamic

    def call(self, name: str, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)``, eagerly or from the signature's graph."""
        names = sorted(kwargs)
        flat = list(args) + [kwargs[k] for k in names]
        sig = self._signature(name + "|" + ",".join(names), flat)
        if sig is None:
            self.stats.eager += 1
            return fn(*args, **kwargs)
        key, dynamic = sig
        state = self._seen.get(key)
        if isinstance(state, _Graph):
            return self._replay(state, flat)
        if key not in self._seen:
            self._seen[key] = "warm"      # the warm-up; the next call captures
        elif state == "warm" and self.graphs < self.max_graphs:
            graph = self._build(key, fn, len(args), names, flat, dynamic)
            if graph is not None:
                return self._replay(graph, flat)
        self.stats.eager += 1
        return fn(*args, **kwargs)

    def _build(self, key, fn, n_pos, names, flat, dynamic) -> Optional[_Graph]:
        inputs = list(flat)
        for i in dynamic:
            inputs[i] = flat[i].clone(memory_format=torch.contiguous_format)

        def body(*xs):
            return fn(*xs[:n_pos], **dict(zip(names, xs[n_pos:])))

        try:
            replay, outputs = self._capture(body, inputs)
        except Exception as e:
            # a capture that failed may leave the allocator's pool half-recorded: no more
            # captures in this cache; the run goes on eagerly
            self._fail(key, e)
            self.max_graphs = 0
            return None
        try:
            _check_outputs(outputs)
        except TypeError as e:   # an unsuitable call stays eager
            self._fail(key, e)
            return None
        g = self._seen[key] = _Graph(replay, inputs, dynamic, outputs)
        self.graphs += 1
        self.stats.captured += 1
        return g

    def _fail(self, key: tuple, e: Exception) -> None:
        self._seen[key] = None
        self.stats.failed += 1
        self.stats.errors.append(f"{key[0]}: {type(e).__name__}: {e}".splitlines()[0])

    def _replay(self, g: _Graph, flat: List[Any]):
        dyn = g.dynamic
        if len(dyn) == 1:
            g.inputs[dyn[0]].copy_(flat[dyn[0]])
        elif dyn:       # one launch for all of them (a kernel per dtype), not one each
            torch._foreach_copy_([g.inputs[i] for i in dyn], [flat[i] for i in dyn])
        g.replay()
        self.stats.replayed += 1
        out = g.outputs
        if isinstance(out, torch.Tensor):
            return out.clone()
        if isinstance(out, (tuple, list)):
            if len(out) < 2:
                return type(out)(x.clone() for x in out)
            copies = [torch.empty_like(x) for x in out]
            torch._foreach_copy_(copies, list(out))
            return type(out)(copies)
        return out


def _check_outputs(out) -> None:
    ok = out is None or isinstance(out, torch.Tensor) or (
        isinstance(out, (tuple, list)) and all(isinstance(x, torch.Tensor) for x in out))
    if not ok:
        raise TypeError(f"a graphed call must return None or tensors, got {type(out).__name__}")


_GET_STREAM = getattr(torch._C, "_cuda_getCurrentStream", None)   # as the cuda runtime's


def current_stream_id(dev: int) -> int:
    """The id of ``dev``'s current stream (``torch.cuda.Stream.stream_id``), without the
    ``Stream`` object ``torch.cuda.current_stream`` builds per read."""
    if _GET_STREAM is None:
        return torch.cuda.current_stream(dev).stream_id
    return _GET_STREAM(dev)[0]


def _stream_key(dev: Optional[int] = None):
    """The caller's stream: graphs replay where they were asked for, one pool each.
    ``dev``: the device, where the caller knows it (looking it up reads the process
    environment, a cost per call that a replay should not pay)."""
    if dev is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        dev = torch.cuda.current_device()
    if dev is None:
        return ("stream", None)
    return ("stream", current_stream_id(dev))


def cuda_capture() -> Capture:
    """The real capture: on a side stream, into one memory pool per caller stream
    (graphs of one stream replay one after another, and their outputs are cloned at
    once, so they may share intermediates); replay on the caller's stream."""
    side = torch.cuda.Stream()
    pools: Dict[int, Any] = {}

    def capture(fn, inputs):
        cur = torch.cuda.current_stream()
        if cur.cuda_stream not in pools:
            pools[cur.cuda_stream] = torch.cuda.graph_pool_handle()
        pool = pools[cur.cuda_stream]
        g = torch.cuda.CUDAGraph()
        # a garbage collection inside the capture could free device or pinned memory of
        # dead objects, an operation that invalidates the capture: none until it ends
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.stream(side):
                g.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    out = fn(*inputs)
                except BaseException:
                    try:
                        g.capture_end()
                    except Exception:
                        pass
                    raise
                g.capture_end()
        finally:
            if gc_was_on:
                gc.enable()
        return g.replay, out

    return capture
