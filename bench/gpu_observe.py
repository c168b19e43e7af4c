"""Observation helpers of ``bench/gpu_overlap.py``: real host syncs through PyTorch's
sync debug mode, GPU kernel time from the profiler, and a one-step profile table.

* ``SyncWatch``: ``torch.cuda.set_sync_debug_mode("warn")`` over a region; each
  "synchronizing CUDA operation" warning is kept with its Python stack. It sees the syncs
  that go through ATen (``.item()``, ``.tolist()``/``.cpu()`` of a device tensor, copies to
  pageable memory, ``nonzero``, boolean indexing, stream synchronize). A sync issued by the
  runtime's own sync calls (``device/cuda.py``: event and stream waits, blocking copies,
  ``to_host``) is already in ``rt.syncs``; every other one ("unseen", e.g. an ``.item()``
  inside a kernel closure) is a host sync the runtime's count misses.
* ``kernel_busy_us``: the union of the device intervals (kernels, copies, memsets) a
  profiler saw, in microseconds: time the GPU was busy on any stream; ``idle_gaps_us``:
  the idle time between them, split into launch seams (short) and waits (long).
* ``gpu_info``/``gpu_line``: the card a figure came from (docs/design.md §8.1): its name,
  memory and SM count from ``torch.cuda``, and, where ``nvidia-smi`` is present, the
  driver, clocks (SM now and max, memory), P-state, temperature, power and the active
  clock event reasons (throttling); taken at the start and the end of a bench.
"""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import traceback
import warnings

import torch

from overlapcheck.device import device_info

_PROJECT = tuple(os.sep + d + os.sep for d in ("overlapcheck", "fake_models", "invariants"))
_RUNTIME_SYNCS = ("_sync_event", "_sync_stream", "synchronize", "to_host", "copy")
_RUNTIME_FILE = os.path.join("device", "cuda.py")


class SyncWatch:
    def __init__(self):
        self.runtime, self.unseen = 0, 0
        self.sites = collections.Counter()

    def __enter__(self):
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._show
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(0)
        self._cm.__exit__(*exc)
        return False

    def _show(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        stack = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith("warnings.py")]
        if any(f.name in _RUNTIME_SYNCS and f.filename.endswith(_RUNTIME_FILE) for f in stack):
            self.runtime += 1
            return
        mine = [g for g in stack if os.sep + "torch" + os.sep not in g.filename]
        if mine and os.path.basename(mine[-1].filename) == os.path.basename(__file__):
            return   # the watcher's own start (it sets the debug mode while a step runs)
        self.unseen += 1
        ours = [f for f in stack if any(p in f.filename for p in _PROJECT)]
        f = ours[-1] if ours else stack[-1]
        site = _site(f)
        # and the innermost frame outside torch, when it is not the project's (a harness)
        if mine and mine[-1] is not f:
            site += " > " + _site(mine[-1])
        self.sites[site] += 1

    def report(self, steps: int) -> dict:
        return {"per_step": round((self.runtime + self.unseen) / steps, 3),
                "runtime_per_step": round(self.runtime / steps, 3),
                "unseen_per_step": round(self.unseen / steps, 3),
                "unseen_sites": dict(self.sites.most_common(5))}


def _site(f) -> str:
    return f"{os.path.join(*f.filename.split(os.sep)[-2:])}:{f.lineno} {f.name}"


def add_pdl_arg(ap) -> None:
    """``--pdl``: programmatic dependent launch of the Triton model kernels
    (docs/design.md §4.10)."""
    ap.add_argument("--pdl", default="auto", choices=("auto", "on", "off"),
                    help="cuda: programmatic dependent launch of the model's Triton kernels "
                         "(auto: on cards of compute capability 9 and up)")


def apply_pdl(ap, choice: str, device: str) -> bool:
    """Sets the kernels' launch as ``--pdl`` asks; whether it is on. ``on`` where no card
    can launch that way is ``ap.error`` (exit 2)."""
    from fake_models.hf import kernels
    if choice == "on" and not (device_info(device).gpu
                               and torch.cuda.get_device_capability()[0] >= 9):
        ap.error("--pdl on: programmatic dependent launch needs a card of compute capability 9+")
    return kernels.set_pdl({"auto": None, "on": True, "off": False}[choice])


def profiler(device: str):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device_info(device).gpu:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts)


def kernel_busy_us(prof):
    """(microseconds the GPU was busy, how it was measured): the union of the device
    intervals (kernels, copies, memsets) the profiler saw; without per-event intervals,
    the sum of self device times (streams running at once counted twice); (0.0, None)
    when the profile holds no device time."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    if spans:
        busy, end = 0.0, float("-inf")
        for s, e in spans:
            if s > end:
                busy, end = busy + (e - s), e
            elif e > end:
                busy, end = busy + (e - end), e
        return busy, "union of device intervals"
    total = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages())
    return (total, "sum of self device time") if total else (0.0, None)


def idle_gaps_us(prof, short_us: float = 10.0):
    """(microseconds idle in gaps under ``short_us``, in longer ones) between the device
    intervals the profiler saw, from the first to the last: short gaps are the launch
    seams between back-to-back kernels, long ones the GPU waiting for the host."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    short = long_ = 0.0
    end = None
    for s, e in spans:
        if end is not None and s > end:
            if s - end < short_us:
                short += s - end
            else:
                long_ += s - end
        end = e if end is None else max(end, e)
    return short, long_


def table(prof, device: str, rows: int = 15) -> str:
    key = "self_device_time_total" if device_info(device).gpu else "self_cpu_time_total"
    try:
        return prof.key_averages().table(sort_by=key, row_limit=rows)
    except (KeyError, AttributeError, ValueError):
        return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


SMI_FIELDS = ("name", "driver_version", "pstate", "clocks.sm", "clocks.max.sm", "clocks.mem",
              "clocks.max.mem", "temperature.gpu", "power.draw", "power.limit",
              "clocks_event_reasons.active")


def _smi(fields, index: int):
    out = subprocess.run(["nvidia-smi", f"--id={index}", f"--query-gpu={','.join(fields)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        return None
    vals = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")] if out.stdout.strip() else []
    return dict(zip(fields, vals)) if len(vals) == len(fields) else None


def gpu_info(device: str) -> dict | None:
    """The card and its state now (None off the GPU); fields nvidia-smi does not know on
    this driver are left out (queried one by one when the whole query fails)."""
    if not device_info(device).gpu:
        return None
    i = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    info = {"name": torch.cuda.get_device_name(i), "capability": f"{p.major}.{p.minor}",
            "memory_gib": round(p.total_memory / 2 ** 30, 1), "sms": p.multi_processor_count,
            "torch_cuda": torch.version.cuda}
    if shutil.which("nvidia-smi"):
        try:
            smi = _smi(SMI_FIELDS, i)
            if smi is None:
                smi = {}
                for f in SMI_FIELDS:
                    smi.update(_smi((f,), i) or {})
            info["smi"] = {k: v for k, v in smi.items() if v and "N/A" not in v and "[" not in v}
        except (OSError, subprocess.SubprocessError) as e:
            info["smi"] = {"error": str(e)[:200]}
    else:
        info["smi"] = {"note": "nvidia-smi not on PATH"}
    return info


def gpu_line(info: dict | None) -> str:
    """One line for a bench's output."""
    if info is None:
        return "gpu: none (simulated device)"
    s = info.get("smi", {})
    parts = [info["name"], f"{info['memory_gib']} GiB", f"{info['sms']} SMs", f"CUDA {info['torch_cuda']}"]
    if "driver_version" in s:
        parts.append(f"driver {s['driver_version']}")
    if "clocks.sm" in s:
        parts.append(f"SM {s['clocks.sm']}/{s.get('clocks.max.sm', '?')} MHz")
    if "clocks.mem" in s:
        parts.append(f"mem {s['clocks.mem']} MHz")
    for k, unit in (("pstate", ""), ("temperature.gpu", " C"), ("power.draw", " W")):
        if k in s:
            parts.append(f"{s[k]}{unit}")
    if "clocks_event_reasons.active" in s:
        parts.append(f"clock events {s['clocks_event_reasons.active']}")
    return "gpu: " + ", ".join(parts)
