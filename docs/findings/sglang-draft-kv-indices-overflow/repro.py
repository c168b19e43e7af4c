"""SGLang 0.5.23: the EAGLE draft-decode kv_indices buffer is too small for a request
within num_steps of its context limit; the kernel stores past each step's row and, at
the last step, past the end of the buffer.

Standalone: imports SGLang (and its triton) only. Run it with the Python SGLang is
installed in; without a GPU, Triton's interpreter runs SGLang's own kernel on the CPU:

    TRITON_INTERPRET=1 python docs/findings/sglang-draft-kv-indices-overflow/repro.py

It launches ``generate_draft_decode_kv_indices`` exactly as
``TritonMultiStepDraftBackend.common_template`` does (``layers/attention/
triton_backend.py`` l.2595), into a buffer of the width ``init_forward_metadata`` gives
it (l.2718-2722, ``draft_kv_indices_buffer_width``), for one request whose committed
length is three tokens short of the context, with 4 draft steps, and a guard of
sentinels right after the buffer. Exits 1 while the kernel stores past the buffer.
"""
import inspect
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_sglang import stand_in_for_torchvision  # noqa: E402  (beside the pages)

CONTEXT, STEPS, TOPK = 16, 4, 1
SEQ_LEN = CONTEXT - 3           # how close the fuzzer's request got (61 of 64, 4 steps)


def buffer_width(num_seqs: int, topk: int, max_context_len: int, num_steps: int) -> int:
    """The width SGLang gives each draft step's row (with ``num_steps`` when the
    function takes it, as the suggested fix makes it)."""
    from sglang.srt.speculative.spec_utils import draft_kv_indices_buffer_width as width
    if "num_steps" in inspect.signature(width).parameters:
        return width(num_seqs, topk, max_context_len, num_steps=num_steps)
    return width(num_seqs, topk, max_context_len)


def launch(seq_len: int = SEQ_LEN, steps: int = STEPS, context: int = CONTEXT):
    """(rows as written, what landed in the 8 guard entries past the buffer)."""
    from sglang.kernels.ops.speculative.cache_locs import generate_draft_decode_kv_indices
    from sglang.srt.utils import next_power_of_2
    num_seqs, bs = 1, TOPK
    row_stride = context + 8                                     # req_to_token's row
    table = torch.arange(1000, 1000 + 2 * row_stride, dtype=torch.int32).view(2, row_stride)
    width = buffer_width(num_seqs, TOPK, context, steps)
    memory = torch.full((steps * width + 8,), -1, dtype=torch.int64)
    kv_indices = memory[:steps * width].view(steps, width)
    kv_indptr = torch.zeros((steps, bs + 1), dtype=torch.int32)
    positions = torch.tensor([seq_len], dtype=torch.int64)
    generate_draft_decode_kv_indices[(steps, num_seqs, TOPK)](
        torch.tensor([1]), table, torch.tensor([seq_len], dtype=torch.int32),
        kv_indices, kv_indptr, positions, row_stride, kv_indices.shape[1],
        kv_indptr.shape[1], next_power_of_2(num_seqs), next_power_of_2(steps),
        next_power_of_2(bs), 1)
    return kv_indices.tolist(), memory[steps * width:].tolist()


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        print("set TRITON_INTERPRET=1 (no GPU: Triton's interpreter runs the kernel)")
        return 2
    stand_in_for_torchvision()
    import sglang
    rows, guard = launch()
    width = len(rows[0])
    print(f"SGLang {sglang.__version__}: a request at {SEQ_LEN} of a {CONTEXT}-token context, "
          f"{STEPS} draft steps; each step's kv_indices row holds {width} entries")
    over = []
    for i in range(STEPS):
        need = SEQ_LEN + i + 1
        where = ("fits" if need <= width else "past the end of the buffer" if i == STEPS - 1
                 else "past its row, into step %d's" % (i + 1))
        print(f"  step {i}: stores {need} entries: {where}")
        over += [i] if need > width else []
    print(f"  the 8 entries past the end of the buffer: {guard}")
    spilled = [x for x in guard if x != -1]
    if over:
        print(f"BUG: draft steps {over} store more entries than their row holds; "
              f"{len(spilled)} landed past the buffer (on a GPU: an out-of-bounds write)")
        return 1
    print("fixed: every step's entries fit its row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
