"""What a run of SGLang's own spec-v2 worker (``EAGLEWorkerV2``) needs on the CPU.

The worker class, its draft worker, the FutureMap and the scheduler's overlap path run
unmodified. Around them, for the duration of a run (``running``):

* every Triton kernel they launch runs its exact CPU twin (``twins``), or SGLang's own
  kernel through Triton's interpreter where no twin covers the variant;
* EAGLE's tree build and greedy verify take SGLang's own Triton route
  (``spec_tree``'s XPU branch, the kernels at ``spec_tree.py`` l.53 and l.211): on a
  plain CPU platform 0.5.23 routes them to CUDA or ``sgl_kernel`` ops that do not
  exist here (``spec_tree.py`` l.31-43, l.411-431);
* the attention backends of the target and draft runners compute through the twins
  of ``decode_attention_fwd``/``extend_attention_fwd``;
* ``support_triton`` answers as on a CUDA platform (Triton is there, ``torch_native``
  and ``intel_amx`` opt out): positions and request->token rows of an extend are
  computed by SGLang's Triton kernels (their twins) instead of its host loops, which
  read device values on the host where the GPU path does not.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List

from . import twins


def attention_backends(scheduler) -> List[object]:
    """The attention backends of the scheduler's target runner and of its spec
    worker's draft runner (the draft decode backend's per-step children included)."""
    out: List[object] = []
    seen = set()

    def add(be) -> None:
        if be is None or id(be) in seen:
            return
        seen.add(id(be))
        out.append(be)
        for child in getattr(be, "attn_backends", None) or ():
            add(child)

    runners = [scheduler.tp_worker.model_runner]
    draft = getattr(scheduler.model_worker, "_draft_worker", None)
    if draft is not None:
        runners.append(draft.draft_runner)
        add(getattr(draft, "draft_attn_backend", None))
        add(getattr(draft, "draft_extend_attn_backend", None))
    for r in runners:
        add(getattr(r, "attn_backend", None))
        add(getattr(r, "draft_attn_backend", None))
    return out


def _cuda_support_triton(backend: str) -> bool:
    """``support_triton`` on a platform with Triton (CUDA's)."""
    return backend not in ["torch_native", "intel_amx"]


@contextlib.contextmanager
def running(scheduler, launches=None) -> Iterator[twins.Launches]:
    """The twins and the Triton routes, in place while the block runs."""
    from sglang.kernels.ops.speculative import spec_tree
    from sglang.srt.utils import common
    from . import source_patch
    saved = spec_tree.__dict__["_is_xpu"]
    spec_tree._is_xpu = True
    triton_route = [(common, "support_triton", common.support_triton, _cuda_support_triton)]
    try:
        with source_patch.installed(triton_route), \
                twins.installed(attention_backends(scheduler), launches) as counts:
            yield counts
    finally:
        spec_tree._is_xpu = saved
