"""Device-side state of the engine: streams, KV buffers, the request->token table,
the FutureMap, forward scratch, pinned staging and result buffers, events.

All of it is allocated once through the runtime; only the per-step index and output
buffers (see ``SpecWorker.launch``) come and go.
"""
from __future__ import annotations

from typing import Iterable

import torch

from ..protocol.canary import CANARY
from .config import EngineConfig
from .faults import FaultSet
from .future_map import future_slots
from .kernels import meta_width


class DeviceState:
    def __init__(self, rt, cfg: EngineConfig, kv_width: int, kv_dtype=None):
        self.rt, self.cfg = rt, cfg
        self.sched = rt.new_stream("schedule")
        self.fwd = rt.new_stream("forward")
        self.copy = rt.new_stream("copy")
        i64, bs, w = torch.int64, cfg.max_running, cfg.spec_steps + 1
        self.target_kv = rt.empty((cfg.pool_tokens, kv_width), kv_dtype or i64, "target_kv",
                                  self.fwd)
        self.table = rt.empty((cfg.max_running, cfg.row_width), i64, "req_to_token", self.fwd)
        # zero-filled like public engines' req_to_token (a never-written cell reads the
        # padding slot, not an out-of-range index); in order before every table write.
        # On a GPU the allocation's poison fill is a kernel on the forward stream: the
        # zeroing on the schedule stream must come after it.
        if not FaultSet(cfg.faults).on("zeroing-without-fill-wait"):   # fault: no wait
            self.sched.wait_stream(self.fwd)
        rt.launch(self.sched, torch.Tensor.zero_, self.table.t, name="zero_table",
                  writes=[self.table])
        # FutureMap: slots indexed by request-pool row or ring slot (future_map.py),
        # written and read by the forward stream
        self.fm_slots = future_slots(cfg)
        self.fm_by_row = cfg.future_map == "row"
        self.fm_tok = rt.empty((self.fm_slots,), i64, "future_token", self.fwd)
        self.fm_len = rt.empty((self.fm_slots,), i64, "future_len", self.fwd)
        # forward scratch: inputs + drafts (a tree's nodes, docs/design.md §4.12),
        # committed lengths, target tokens
        n = cfg.num_draft_tokens if cfg.tree else w
        self.drafts = rt.empty((bs, n), i64, "drafts", self.fwd)
        self.lens = rt.empty((bs,), i64, "lens", self.fwd)
        self.tgt = rt.empty((bs, n), i64, "target_tokens", self.fwd)
        if cfg.tree:   # the accepted path's nodes and their tokens (its inputs)
            self.tree_path = rt.empty((bs, w), i64, "tree_path", self.fwd)
            self.chain = rt.empty((bs, w), i64, "accepted_inputs", self.fwd)
        # double-buffered pinned staging (host -> device) and results (device -> host)
        self.meta_pin = [rt.host_empty((bs, meta_width(cfg)), i64, f"meta_pinned{p}")
                         for p in (0, 1)]
        self.cells_pin = [rt.host_empty((cfg.staged_cells, 3), i64, f"cells_pinned{p}")
                          for p in (0, 1)]
        self.ptok_pin = [rt.host_empty((cfg.chunk_size, 4), i64, f"prefill_tokens_pinned{p}")
                         for p in (0, 1)]
        self.tok_pin = [rt.host_empty((bs, w), i64, f"tokens_pinned{p}") for p in (0, 1)]
        self.acc_pin = [rt.host_empty((bs,), i64, f"accept_lens_pinned{p}") for p in (0, 1)]
        self.can_pin = [rt.host_empty((bs, CANARY), i64, f"canary_pinned{p}") for p in (0, 1)]
        self.done = [rt.new_event(f"copy_done{p}") for p in (0, 1)]
        self.war = rt.new_event("table_reads_done")
        self.kv_buffers = [self.target_kv]     # drafters add their KV buffers
        self.row_buffers = [self.table]        # and their FutureMap buffers (future_buffer)
        self.future_buffer(self.fm_tok, self.fm_len)
        # seq_lens_sum: the attention metadata's total length, on the device; with
        # verify_sync the host computes it from the previous verify's published lengths
        self.lens_sum = rt.empty((1,), i64, "seq_lens_sum", self.fwd)
        self.new_lens = rt.empty((bs,), i64, "published_lens", self.fwd)
        self.lens_pin = [rt.host_empty((bs,), i64, f"published_lens_pinned{p}") for p in (0, 1)]
        self.verified = [rt.new_event(f"verify_done{p}") for p in (0, 1)]
        if cfg.kv_backup:
            self._backup_buffers(rt, cfg, kv_width, kv_dtype)

    def _backup_buffers(self, rt, cfg: EngineConfig, kv_width: int, kv_dtype) -> None:
        """The KV backup stream, its host pool and request->host-pool table (kv_backup)."""
        i64 = torch.int64
        self.backup = rt.new_stream("backup")
        # allocated (and poison-filled) on the forward stream: the forward reads it back
        # (check_backup) and the backup stream writes it only after the forward's done event
        self.host_kv = rt.empty((cfg.pool_tokens, kv_width), kv_dtype or i64, "host_kv_pool",
                                self.fwd)
        self.host_table = rt.empty((cfg.max_running, cfg.row_width), i64, "req_to_host",
                                   self.fwd)
        self.sched.wait_stream(self.fwd)          # after its poison fill (see the table)
        rt.launch(self.sched, torch.Tensor.zero_, self.host_table.t, name="zero_host_table",
                  writes=[self.host_table])
        self.row_buffers.append(self.host_table)
        self.hcells_pin = [rt.host_empty((cfg.staged_cells, 3), i64, f"host_cells_pinned{p}")
                           for p in (0, 1)]
        self.forward_done = rt.new_event("forward_done")
        self.backup_done = rt.new_event("backup_done")

    def future_buffer(self, *bufs) -> None:
        """FutureMap buffers: indexed by row, they change owner with the row; a ring's
        slots belong to no request (the host keeps pending ones from reuse)."""
        if self.fm_by_row:
            self.row_buffers.extend(bufs)

    def transfer_host_slots(self, slots: Iterable[int], owner) -> None:
        """Host-pool slots change owner (None: freed)."""
        self.rt.transfer(self.host_kv, list(slots), owner)

    def h2d(self, pinned, name: str):
        """A fresh schedule-stream buffer filled from ``pinned`` by a non-blocking copy."""
        buf = self.rt.empty(pinned.t.shape, pinned.t.dtype, name, self.sched)   # a Size
        self.rt.copy(buf, pinned, self.sched, non_blocking=True)
        return buf

    def transfer_slots(self, slots: Iterable[int], owner) -> None:
        """KV slots change owner (None: freed) in every KV buffer."""
        slots = list(slots)
        for buf in self.kv_buffers:
            self.rt.transfer(buf, slots, owner)

    def transfer_row(self, row: int, owner) -> None:
        """A request-pool row changes owner: its table row and FutureMap rows."""
        for buf in self.row_buffers:
            self.rt.transfer(buf, [row], owner)
