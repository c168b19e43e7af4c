"""``fuzz --ray ADDRESS``: a campaign's slices on a Ray cluster.

A *slice* is one of the independent campaigns ``--jobs N`` runs (``jobs.job_options``:
its own sub-seed, its share of an example budget, its own local database folder, the
shared database shared), run as a Ray task on whichever node has a free CPU. So for
a fixed seed and example budget, N slices find what ``-j N`` finds.

* **Streaming.** A slice sends each finding, as it writes it, to a collector actor:
  its summary line and its repro documents (the YAML repro and the Perfetto trace, as
  text), first when it sees it and again each time shrinking replaces it. The driver
  polls the collector, deduplicates by finding id and writes each repro under a name
  of its own in ``--out``, replaced by the later versions from the slice that found it
  first; a finding a slice sent before its worker died is kept.
* **Time box.** ``--time T`` counts from the command's start: the cluster's start,
  the workers' start and imports are inside it. Each slice gets what is left of T
  when it starts (shrinking ends with it, plus ``--shrink-time``); a slice still
  running ``GRACE_S`` seconds after that is cancelled and reported as lost. The end
  is sent as wall-clock time: the nodes' clocks are taken to agree (NTP).
* **Lost workers.** A slice whose worker dies is rerun once by Ray (the same seed, on
  what is left of the time box); dying again, it is reported as lost. Exit 1 then.
* **Addresses.** ``local:N`` starts a cluster of N worker CPUs on this machine (on the
  loopback address) for the campaign and stops it afterwards; ``auto`` joins the
  cluster this machine belongs to; ``HOST:PORT`` (a head's GCS) or ``ray://HOST:PORT``
  (Ray Client) join that one. An address that does not answer is one line, exit 2.
  Every node needs the same overlapcheck (and engines) installed.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:
    from .campaign import Options

GRACE_S = 5.0          # how long past its time box a slice may take to return
POLL_S = 0.5
CONNECT_TIMEOUT_S = 5.0
SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"    # "0": every Ray address on loopback


class Collector:
    """The actor slices stream to: ``put`` appends, ``take`` hands over what came
    since the last ``take``. (Its process imports this module alone, which is why the
    campaign's modules are imported where they are used: an actor that imported the
    engine would take seconds of CPU from the slices at every campaign's start.)"""

    def __init__(self):
        self._items: List[dict] = []

    def put(self, item: dict) -> None:
        self._items.append(item)

    def take(self) -> List[dict]:
        items, self._items = self._items, []
        return items


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def _check_reachable(address: str) -> None:
    from ..errors import UsageError
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray {address!r}: HOST:PORT, ray://HOST:PORT, auto or local:N")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UsageError(f"--ray: cannot reach the Ray cluster at {address} "
                         f"({e.strerror or _one_line(e)})") from None


def connect(address: str) -> bool:
    """Join or start the cluster ``address`` names; True when this process started it
    (and so stops it). ``UsageError`` (one line) when it cannot."""
    from ..errors import UsageError
    local = address.startswith("local:")
    if local and "ray" not in sys.modules:
        # a cluster of this machine alone: Ray's single-machine mode keeps every
        # component on the loopback address (read when ray is imported)
        os.environ.setdefault(SINGLE_MACHINE, "0")
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs the ray package: pip install 'overlapcheck[fleet]'") from None
    if ray.is_initialized():
        return False
    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if local:
        n = address[len("local:"):]
        if not n.isdigit() or int(n) < 1:
            raise UsageError(f"--ray {address!r}: local:N needs a number of workers N >= 1")
        kwargs.update(num_cpus=int(n), object_store_memory=100 << 20)
        target = "local"    # a new cluster, even where a `ray start` one is recorded
    elif address == "auto":
        target = "auto"
    else:
        _check_reachable(address[len("ray://"):] if address.startswith("ray://") else address)
        target = address
    try:
        ray.init(address=target, **kwargs)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        raise UsageError(f"--ray {address}: {_one_line(e)}") from None
    return local


def _slice(opts: Options, j: int, deadline: Optional[float], collector, verbose: bool) -> dict:
    """One slice on a worker: a campaign on what is left of the time box, each finding
    sent to ``collector`` with its repro documents as it is recorded."""
    from .campaign import Campaign, finding_summary
    from .jobs import tune_process
    collector.put.remote({"kind": "start", "slice": j, "host": socket.gethostname(),
                          "pid": os.getpid()})
    if deadline is not None:
        # another host's monotonic clock: the slice's box is what is left of the wall one
        opts = dataclasses.replace(opts, seconds=max(deadline - time.time(), 0.01), started=None)

    def on_finding(found) -> None:
        docs = {}
        for name, path in (("repro", found.repro),
                           ("trace", found.repro[:-5] + ".trace.json" if found.repro else None)):
            if path and os.path.exists(path):
                with open(path, encoding="utf-8") as fh:
                    docs[name] = fh.read()
        collector.put.remote({"kind": "finding", "slice": j, "finding": finding_summary(found),
                              **docs})

    def progress(line: str) -> None:
        if not line.startswith("finding "):    # the driver says where it wrote each one
            collector.put.remote({"kind": "line", "slice": j, "line": line})

    with tempfile.TemporaryDirectory(prefix="overlapcheck-slice-") as tmp:
        opts = dataclasses.replace(opts, out=tmp, on_finding=on_finding,
                                   progress=progress if verbose else None)
        campaign = Campaign(opts)
        tune_process(opts.device)      # as a -j worker process
        summary = campaign.run().summary()
    for f in summary["findings"]:
        f["repro"] = None      # the driver's copy is the one that counts
    return summary


class _Driver:
    """Submits the slices, drains the collector, writes repros once, watches the time."""

    def __init__(self, opts: Options, slices: int, deadline: Optional[float]):
        import ray
        self.ray, self.opts, self.deadline = ray, opts, deadline
        self.say = opts.progress or (lambda line: None)
        self.collector = ray.remote(num_cpus=0)(Collector).remote()
        task = ray.remote(num_cpus=1, max_retries=1, retry_exceptions=False)(_slice)
        verbose = opts.progress is not None
        from .jobs import job_options
        self.pending = {task.remote(o, j, deadline, self.collector, verbose): j
                        for j, o in enumerate(job_options(opts, slices))}
        self.parts: List[dict] = []
        self.lost: List[dict] = []
        self.streamed: Dict[str, dict] = {}     # finding id -> its summary entry
        self.slices = {j: {"slice": j, "attempts": 0, "hosts": []} for j in range(slices)}

    def _write(self, item: dict, path: Optional[str] = None) -> Optional[str]:
        """Write a streamed repro: under a name of its own (``write_new``: another
        campaign's repro of the same bug in ``--out`` is left alone), or over ``path``,
        the name its first version took."""
        if not self.opts.out or "repro" not in item:
            return path
        from ..repro.format import write_atomic, write_new
        if path is None:
            path = write_new(self.opts.out, item["finding"]["id"], ".yaml", item["repro"])
        else:
            write_atomic(path, item["repro"])
        if "trace" in item:
            write_atomic(path[:-5] + ".trace.json", item["trace"])
        return path

    def drain(self) -> None:
        for item in self.ray.get(self.collector.take.remote()):
            j = item["slice"]
            if item["kind"] == "start":
                rec = self.slices[j]
                rec["attempts"] += 1
                rec["hosts"].append(f"{item['host']}:{item['pid']}")
                again = " (rerun: its worker was lost)" if rec["attempts"] > 1 else ""
                self.say(f"[slice {j}] started on {item['host']} (pid {item['pid']}){again}")
            elif item["kind"] == "line":
                self.say(f"[slice {j}] {item['line']}")
            elif item["finding"]["id"] not in self.streamed:
                f = dict(item["finding"], repro=self._write(item), slice=j)
                self.streamed[f["id"]] = f
                self.say(f"[slice {j}] finding {f['id']}: {f['text'].splitlines()[0]}"
                         + (f" -> {f['repro']}" if f["repro"] else ""))
            elif self.streamed[item["finding"]["id"]]["slice"] == j:
                # a smaller case of it, from the slice that found it first: replaces it
                old = self.streamed[item["finding"]["id"]]
                self.streamed[old["id"]] = dict(item["finding"], slice=j,
                                                repro=self._write(item, old["repro"]))

    def _overdue(self) -> bool:
        if self.deadline is None:
            return False
        return time.time() > self.deadline + (self.opts.shrink_seconds or 0.0) + GRACE_S

    def run(self) -> None:
        ray = self.ray
        while self.pending:
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=POLL_S)
            self.drain()
            for ref in ready:
                j = self.pending.pop(ref)
                try:
                    self.parts.append(ray.get(ref))
                except ray.exceptions.RayError as e:
                    self._lose(j, _one_line(e.cause if getattr(e, "cause", None) else e))
            if self.pending and self._overdue():
                for ref, j in self.pending.items():
                    ray.cancel(ref, force=True)
                    self._lose(j, f"still running {GRACE_S:g} s past the time box: cancelled")
                self.pending = {}
        self.drain()

    def _lose(self, j: int, why: str) -> None:
        self.lost.append({"slice": j, "why": why, "attempts": self.slices[j]["attempts"]})
        self.say(f"[slice {j}] lost: {why}")

    def summary(self, secs: float, slices: int) -> dict:
        from .jobs import merge
        s = merge(self.opts, self.parts, secs, slices)
        # findings streamed by slices that were lost later, and the driver's repro paths
        by_id = {f["id"]: f for f in s["findings"]}
        for fid, f in self.streamed.items():
            f = {k: v for k, v in f.items() if k != "slice"}
            by_id.setdefault(fid, f)["repro"] = f["repro"]
        s["findings"] = sorted(by_id.values(), key=lambda f: f["seconds_before"])
        s["ray"] = {"slices": list(self.slices.values())}
        s["lost"] = self.lost
        if not s["engine_version"]:
            from .. import targets
            s["engine_version"] = targets.get(self.opts.target).version()
        return s


def run_ray(opts: Options, address: str, slices: Optional[int] = None) -> dict:
    """Run the campaign ``opts`` as ``slices`` slices (default: the cluster's CPUs) on the
    Ray cluster at ``address``; the merged summary, with ``lost`` slices and per-slice
    attempts under ``ray``."""
    if opts.on_begin is not None:
        opts.on_begin()     # the slices keep the box from here (a cluster's start-up is theirs)
    t0, wall0 = time.monotonic(), time.time()
    deadline = None if opts.seconds is None else wall0 + opts.seconds
    started = connect(address)
    import ray
    try:
        if slices is None:
            slices = max(1, int(ray.cluster_resources().get("CPU", 1)))
        driver = _Driver(opts, slices, deadline)
        driver.run()
        return driver.summary(time.monotonic() - t0, slices)
    finally:
        if started:
            ray.shutdown()
