"""What a run of SGLang's own spec-v2 workers (``EAGLEWorkerV2``,
``FrozenKVMTPWorkerV2``) needs on the CPU.

The worker classes, their draft workers, the FutureMap and the scheduler's overlap path
run unmodified. Around them, for the duration of a run (``running``):

* every Triton kernel they launch runs its exact CPU twin (``twins``), or SGLang's own
  kernel through Triton's interpreter where no twin covers the variant;
* EAGLE's tree build and greedy verify take SGLang's own Triton route
  (``spec_tree``'s XPU branch, the kernels at ``spec_tree.py`` l.53 and l.211): on a
  plain CPU platform 0.5.23 routes them to CUDA or ``sgl_kernel`` ops that do not
  exist here (``spec_tree.py`` l.31-43, l.411-431); so do the verify's write slots
  (``cache_locs.py`` l.632, l.700: off those platforms and SGLang's CPU engine,
  ``assign_extend_cache_locs_func`` falls through and returns None);
* the attention backends of the target and draft runners compute through the twins
  of ``decode_attention_fwd``/``extend_attention_fwd``;
* ``support_triton`` answers as on a CUDA platform (Triton is there, ``torch_native``
  and ``intel_amx`` opt out): positions and request->token rows of an extend are
  computed by SGLang's Triton kernels (their twins) instead of its host loops, which
  read device values on the host where the GPU path does not.

One SGLang bug of the pinned release stops a loop before its first step, and only
there its upstream fix is applied (``UPSTREAM_FIXES``): the normal loop passes
``pp_proxy_tensors`` to every spec-v2 worker (``scheduler.py`` l.4827-4829), and
``FrozenKVMTPWorkerV2.forward_batch_generation`` (``frozen_kv_mtp_worker_v2.py``
l.762-764) does not take it: a ``TypeError`` at the first batch (sgl-project/sglang
#40155, fixed by the open #40169/#40355, which add the keyword and hand it to the
target on prefill, as ``EAGLEWorkerV2`` does). The overlap loop never passes it and
runs the worker as released.
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


#: (worker, loop it stops: "normal"/"overlap", upstream issue, "module:function",
#: edits): an SGLang bug that stops a loop of a real worker before it runs, patched
#: with its upstream fix in that loop only (``source_patch``: each edit exact, once)
UPSTREAM_FIXES = (
    ("frozen-kv-mtp-v2", "normal", "sgl-project/sglang#40155 (fix: #40169, #40355)",
     "sglang.srt.speculative.frozen_kv_mtp_worker_v2:"
     "FrozenKVMTPWorkerV2.forward_batch_generation",
     (("        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None\n",
       "        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None,\n"
       "        pp_proxy_tensors=None,\n"),
      ("                batch, capture_hidden_mode=CaptureHiddenMode.FULL\n",
       "                batch, capture_hidden_mode=CaptureHiddenMode.FULL,\n"
       "                pp_proxy_tensors=pp_proxy_tensors,\n"))),
)


def upstream_fixes(worker: str, overlap: bool) -> list:
    """The source patches of ``UPSTREAM_FIXES`` for a run of ``worker`` in that loop."""
    from . import source_patch
    loop = "overlap" if overlap else "normal"
    return [source_patch.edited(target, edits, f"upstream fix {issue.split()[0]}")
            for w, stops, issue, target, edits in UPSTREAM_FIXES if (w, stops) == (worker, loop)]


def _cuda_support_triton(backend: str) -> bool:
    """``support_triton`` on a platform with Triton (CUDA's)."""
    return backend not in ["torch_native", "intel_amx"]


def check_interpreted() -> None:
    """SGLang's Triton kernels must be interpreted ones (the twins take over their
    launches); ``env.stubbed`` sets ``TRITON_INTERPRET=1`` before SGLang's import."""
    from sglang.kernels.ops.speculative import eagle

    from ..triton_launch import require_interpreted
    require_interpreted(eagle.fill_bonus_tokens, "SGLang", "sglang")
    import triton.language as tl      # its helpers, which SGLang's kernels call
    require_interpreted(tl.cdiv, "Triton", "sglang")


@contextlib.contextmanager
def running(scheduler, launches=None, fixes=()) -> Iterator[twins.Launches]:
    """The twins and the Triton routes (and ``fixes``, from ``upstream_fixes``), in
    place while the block runs."""
    check_interpreted()
    from sglang.kernels.ops.speculative import cache_locs, spec_tree
    from sglang.srt.utils import common
    from . import source_patch
    routed = (spec_tree, cache_locs)
    saved = [m.__dict__["_is_xpu"] for m in routed]
    for m in routed:
        m._is_xpu = True
    triton_route = [(common, "support_triton", common.support_triton, _cuda_support_triton)]
    try:
        with source_patch.installed(triton_route + list(fixes)), \
                twins.installed(attention_backends(scheduler), launches) as counts:
            yield counts
    finally:
        for m, flag in zip(routed, saved):
            m._is_xpu = flag
