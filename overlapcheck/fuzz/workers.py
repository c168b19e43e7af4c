"""The processes of ``fuzz -j N``: each worker a campaign of its own (``jobs.job_options``)
that sends its parent what it finds as it finds it; the parent keeps the time box.

* worker -> parent, over a pipe each: ``("finding", j, summary entry)`` when a finding is
  first written and each time a smaller case replaces it, ``("stats", j, figures)`` once
  a second, ``("done", j, summary)`` at the end;
* parent -> workers: ``("known", key)`` for each new finding (the others no longer
  report it), and an event that stops them all (the end of the box, a signal);
* a worker still running ``GRACE_S`` after that is killed: its findings are on disk and
  in the parent's hands already. The fork server is ended with the workers.

``run_jobs`` runs a campaign in this process (one job) or as these workers.

See docs/design.md §6.5.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from .jobs import _context, job_options, merge, tune_process

if TYPE_CHECKING:
    from .campaign import Options


def job(opts: "Options", j: int, conn, stop) -> None:
    """One worker of ``fuzz -j N``: a campaign whose findings, figures and summary go to
    the parent through ``conn`` as they happen (``("finding", j, summary entry)``,
    ``("stats", j, figures)``, ``("done", j, summary)``), and which hears from it the
    findings of the other workers (``("known", key)``: known from then on, so that the
    bug is written once); it stops when ``stop`` (an event the parent sets) is set, or
    at its time box. Ctrl-C is the parent's to handle: the worker ignores SIGINT and
    hears the parent's decision through ``stop``."""
    import signal

    from .campaign import Campaign, finding_summary
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    known = set(opts.known)
    polled = [0.0]

    def send(*msg) -> None:
        try:
            conn.send(msg)
        except (OSError, ValueError):    # the parent is gone: the campaign goes on alone
            pass

    def stopped():
        now = time.monotonic()
        if now - polled[0] >= 0.2:       # the siblings' findings, five times a second
            polled[0] = now
            try:
                while conn.poll():
                    kind, key = conn.recv()
                    known.add(tuple(key))
            except (OSError, EOFError, ValueError):
                pass
        return "stopped by the parent" if stop.is_set() else None

    opts = dataclasses.replace(
        opts, stop=stopped, known=known,
        on_finding=lambda found: send("finding", j, finding_summary(found)),
        on_stats=lambda st: send("stats", j, _figures(st)))
    campaign = Campaign(opts)
    tune_process(opts.device)
    summary = campaign.run().summary()
    send("done", j, summary)
    conn.close()


def _figures(st) -> dict:
    return {"examples": st.examples, "steps": st.steps, "shrink_runs": st.shrink_runs,
            "cpu_seconds": round(st.cpu_seconds, 2), "hypothesis_runs": st.runs}


def stop_server() -> None:
    """End the fork server now (``start_server``): left to notice that this process has
    ended, it tears its interpreter down (seconds, with torch imported) while holding
    the command's stdout and stderr open, so whoever reads them waits past the time box.
    It runs nothing of ours once the workers have ended. A no-op where it does not run."""
    import os
    import signal
    try:
        from multiprocessing import forkserver, util
        server = forkserver._forkserver
        pid, alive = server._forkserver_pid, server._forkserver_alive_fd
        address = server._forkserver_address
    except (ImportError, AttributeError):     # another multiprocessing: left to end alone
        return
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(alive)
        if address and not util.is_abstract_socket_namespace(address):
            os.unlink(address)
    except (OSError, ChildProcessError):
        pass
    server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None


GRACE_S = 0.3    # how long past its time box a worker may take to send its summary


class Workers:
    """The parent of ``fuzz -j N``: starts the workers, reads what they send as it
    comes, prints one progress line for all of them, keeps the time box."""

    def __init__(self, opts: "Options", jobs: int):
        self.opts, self.jobs = opts, jobs
        self.say = opts.progress or (lambda line: None)
        self.found: dict = {}        # finding id -> its latest summary entry (earliest job's)
        self.parts: dict = {}        # job -> its summary
        self.figures: dict = {j: _figures_zero() for j in range(jobs)}
        self.killed: list = []
        # the box's end: from the command's start (``opts.started``); without one, each
        # worker's box starts with its campaign, and the parent only stops one that is
        # still running a minute after it should have ended
        box = None if opts.seconds is None else opts.seconds + (opts.shrink_seconds or 0.0)
        self.end = None if box is None or opts.started is None else opts.started + box
        self.late = None if box is None or opts.started is not None else box + 60.0
        self.stopped = None
        self.launched = None    # when the workers were started

    def run(self, t0: float) -> dict:
        from multiprocessing.connection import wait
        self.launched = time.monotonic()
        if self.end is not None and self.launched >= self.end:
            stop_server()        # start-up took the whole box: no worker would run anything
            return self._summary(time.monotonic() - t0)
        if self.late is not None:
            self.end = self.launched + self.late
        if self.opts.on_begin is not None:
            self.opts.on_begin()    # this loop keeps the box from here
        ctx = _context()
        stop = ctx.Event()
        procs, conns = {}, {}
        for j, o in enumerate(job_options(self.opts, self.jobs)):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=job, args=(o, j, theirs, stop), daemon=True,
                            name=f"overlapcheck-fuzz-{j}")
            p.start()
            theirs.close()
            procs[j], conns[mine] = p, j
        self.conns = conns
        from .stopping import Stop
        if isinstance(self.opts.stop, Stop):     # a second Ctrl-C ends the workers too
            self.opts.stop.on_exit = lambda: [p.kill() for p in procs.values()]
        last_line, stop_at = time.monotonic(), None
        try:
            while conns:
                for c in wait(list(conns), timeout=0.1):
                    try:
                        self._take(c.recv())
                    except (EOFError, OSError):      # the worker ended (or was killed)
                        del conns[c]
                now = time.monotonic()
                if self.stopped is None and self.opts.stop is not None:
                    self.stopped = self.opts.stop()
                if stop_at is None and (self.stopped is not None
                                        or (self.end is not None and now >= self.end)):
                    stop_at = now
                    stop.set()
                if stop_at is not None and now >= stop_at + GRACE_S:
                    self._kill(procs, conns)
                if now - last_line >= 5.0:
                    last_line = now
                    self._line(now - t0)
        finally:
            stop.set()
            self._kill(procs, conns)
            stop_server()
        return self._summary(time.monotonic() - t0)

    def _take(self, msg) -> None:
        kind, j, body = msg
        if kind == "stats":
            self.figures[j] = body
        elif kind == "done":
            self.parts[j] = body
        elif kind == "finding":
            old = self.found.get(body["id"])
            if old is None:
                self.found[body["id"]] = dict(body, job=j)
                key = (body["checker"], *body["site"])
                for c, k in list(self.conns.items()):   # the others need not write it again
                    if k != j:
                        try:
                            c.send(("known", key))
                        except (OSError, ValueError):
                            pass
                self.say(f"[job {j}] finding {body['id']} after {body['examples_before']} "
                         f"examples ({body['seconds_before']:.1f}s): "
                         f"{body['text'].splitlines()[0]}"
                         + (f" -> {body['repro']}" if body.get("repro") else ""))
            elif old["job"] == j:         # a smaller case of it, from the job that found it
                self.found[body["id"]] = dict(body, job=j)

    def _kill(self, procs: dict, conns: dict) -> None:
        for j, p in procs.items():
            if p.is_alive():
                p.kill()
                if j not in self.parts:
                    self.killed.append(j)
        for p in procs.values():
            p.join(1.0)
        for c in list(conns):
            c.close()
        conns.clear()

    def _line(self, secs: float) -> None:
        ex = sum(f["examples"] for f in self.figures.values())
        steps = sum(f["steps"] for f in self.figures.values())
        rate = steps / secs if secs > 0 else 0.0
        self.say(f"[{secs:6.1f}s] {self.jobs} jobs: examples {ex}, steps {steps} "
                 f"({rate:.0f} steps/s), findings {len(self.found)}")

    def _summary(self, secs: float) -> dict:
        from .. import targets
        parts = []
        for j in range(self.jobs):
            part = self.parts.get(j)
            if part is None:      # killed or crashed: what it sent is what it found
                fig = self.figures[j]
                part = dict(fig, engine_version="", replayed=0, findings=[])
            parts.append(part)
        s = merge(self.opts, parts, secs, self.jobs)
        by_id = {f["id"]: f for f in s["findings"]}
        for fid, f in self.found.items():
            # the job whose finding was reported first keeps it (its repro is the path
            # the progress line named; the jobs' clocks differ, so no other order holds):
            # its final form where the job ended, else the latest it streamed
            final = [g for g in self.parts.get(f["job"], {}).get("findings", ())
                     if g["id"] == fid]
            by_id[fid] = final[0] if final else {k: v for k, v in f.items() if k != "job"}
        s["findings"] = sorted(by_id.values(), key=lambda f: f["seconds_before"])
        if not s["engine_version"]:
            s["engine_version"] = targets.get(self.opts.target).version()
        s["stopped"] = self.stopped
        began = self.opts.started if self.opts.started is not None else self.launched
        s["start_up_seconds"] = max([round(self.launched - began, 2)]
                                    + [p.get("start_up_seconds", 0.0) for p in parts])
        if self.killed:
            s["killed"] = sorted(self.killed)
        return s


def _figures_zero() -> dict:
    return {"examples": 0, "steps": 0, "shrink_runs": 0, "cpu_seconds": 0.0,
            "hypothesis_runs": 0}


def run_jobs(opts: "Options", jobs: int) -> dict:
    """Run the campaign ``opts`` as ``jobs`` processes (one: in this process; several:
    ``workers.Workers``); the merged summary."""
    from .campaign import Campaign
    t0 = time.monotonic()
    if jobs == 1:
        if (opts.seconds is not None and opts.started is not None
                and t0 >= opts.started + opts.seconds + (opts.shrink_seconds or 0.0)):
            return Workers(opts, 1).run(t0)     # start-up took the box: nothing to run
        campaign = Campaign(opts)
        tune_process(opts.device)
        if opts.on_begin is not None:
            opts.on_begin()     # the campaign keeps the box from here
        s = campaign.run().summary()
        s["jobs"] = 1
        return s
    return Workers(opts, jobs).run(t0)
