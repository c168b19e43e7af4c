"""Nightly GPU fuzz job: time-boxed ``overlapcheck fuzz --device cuda`` campaigns, then a
short compute-sanitizer memcheck pass; everything lands in one output folder.

Campaigns run one after another, each in its own process (its own process group), with
consecutive seeds, in rounds over the models (docs/design.md §6.9): each model has an
equal share of the fuzz budget, is charged the wall time its campaigns really took
(start-up, shrinking and overruns included) and gets campaigns while its share lasts, so
a slow model (a long start-up, a worker outliving its time box) spends its own share,
not the others': the grace a worker gets past its time box is capped by what is left of
its model's share (never under its shrink time). Campaigns, seconds, examples, steps and
findings per model are in ``summary.json`` (``per_model``) and the printed summary. A worker
that crashes (a CUDA fatal error, a signal, an uncaught exception), exits with a code
other than 0 (clean) or 1 (findings, with its JSON summary), or outlives its time box is
recorded as a finding with what reproduces it (command, seed, stderr tail, the repro
files it had already written) and the campaign goes on with the next seed.

Output folder: ``summary.json`` (rewritten after each campaign), ``hypothesis-db/``
(the example database every campaign shares; with ``--shared-db redis://HOST:PORT[/N]``,
or ``OVERLAPCHECK_SHARED_DB`` set, multiplexed with a Redis server the whole fleet
shares, so each night replays what any machine found: ``docs/fleet.md``),
``repros/<campaign>/`` (YAML repros and
Perfetto traces), ``logs/<campaign>.{stdout,stderr}``, ``sanitizer/`` (log, repros).
Exit 0: nothing found; 1: findings, crashes or sanitizer errors; 2: usage error.

    python ci/nightly_gpu.py --device cuda --minutes 60 --out nightly-out
    python ci/nightly_gpu.py --device sim --minutes 1     # dry run on a CPU machine
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

from overlapcheck.device import DEVICES, device_info

CUDA_FATAL = re.compile(r"CUDA error|cudaError|illegal memory access|device-side assert|"
                        r"unspecified launch failure|CUBLAS_STATUS|CUDNN_STATUS|misaligned address")
SUMMARY_RE = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")


class Parser(argparse.ArgumentParser):
    def error(self, message):   # one line, exit 2
        sys.stderr.write(f"nightly_gpu: error: {message}\n")
        sys.exit(2)


def parse_args(argv=None):
    p = Parser(description=__doc__.split("\n\n")[0], epilog="exit 0: clean; 1: findings; 2: usage")
    p.add_argument("--minutes", type=float, default=60.0, help="total budget (default 60)")
    p.add_argument("--out", default="nightly-out", help="output folder (default nightly-out)")
    p.add_argument("--device", default="cuda", choices=tuple(DEVICES),
                   help="cuda (default); sim is a dry run of the whole job on a CPU machine")
    p.add_argument("--models", default="trained,oracle,tiny",
                   help="comma-separated models, an equal share of the budget each, in rounds "
                        "(default trained,oracle,tiny)")
    p.add_argument("--seed", type=int, default=None,
                   help="first seed; campaign i uses seed+i (default: today's date, YYYYMMDD)")
    p.add_argument("--campaign-seconds", type=float, default=None,
                   help="time box of one campaign (default: the fuzz budget over the models, 30..600)")
    p.add_argument("--max-campaigns", type=int, default=None, help="stop after N campaigns")
    p.add_argument("--shrink-seconds", type=float, default=None,
                   help="cap on shrinking one finding (default: a quarter of the time box, >= 10 s)")
    p.add_argument("--grace", type=float, default=None,
                   help="seconds a worker may run past its time box (shrinking) before it is "
                        "killed and recorded as a timeout (default: max(60, time box); capped by "
                        "its model's share left, never under the shrink time)")
    p.add_argument("--startup-seconds", type=float, default=10.0,
                   help="a worker's start-up, kept out of its time box within its model's share "
                        "(default 10)")
    p.add_argument("--fault", action="append", default=[], metavar="NAME",
                   help="turn a bug-zoo fault on in every campaign (a canary that the job finds it)")
    p.add_argument("--jobs", type=int, default=1, help="fuzz processes per campaign (default 1)")
    p.add_argument("--shared-db", default=os.environ.get("OVERLAPCHECK_SHARED_DB") or None,
                   metavar="redis://HOST:PORT[/N]",
                   help="a Redis example database shared with the fleet, beside the local one "
                        "(default: $OVERLAPCHECK_SHARED_DB, else none)")
    p.add_argument("--sanitizer", default="compute-sanitizer",
                   help="compute-sanitizer executable (default: on PATH or /usr/local/cuda/bin)")
    p.add_argument("--no-sanitizer", action="store_true", help="skip the memcheck pass")
    p.add_argument("--sanitizer-examples", type=int, default=3,
                   help="fuzz examples under memcheck (default 3)")
    p.add_argument("--sanitizer-model", default="oracle",
                   help="model under memcheck (default oracle: the trained pair's thousands of "
                        "tiny kernels per step outrun the pass's time box under memcheck)")
    p.add_argument("--sanitizer-seconds", type=float, default=300.0,
                   help="time box of the memcheck pass (default 300; at most 35%% of --minutes "
                        "unless that is under 60 s)")
    p.add_argument("--worker-cmd", default=None, metavar="CMD",
                   help="testing hook: run CMD instead of 'python -m overlapcheck' (the fuzz "
                        "arguments are appended)")
    a = p.parse_args(argv)
    a.models = [m for m in a.models.split(",") if m]
    if not a.models:
        p.error("--models names no model")
    for name, v in (("--minutes", a.minutes), ("--jobs", a.jobs), ("--sanitizer-examples",
                    a.sanitizer_examples), ("--sanitizer-seconds", a.sanitizer_seconds)):
        if v <= 0:
            p.error(f"{name} must be positive, got {v}")
    for name, v in (("--campaign-seconds", a.campaign_seconds), ("--max-campaigns", a.max_campaigns),
                    ("--grace", a.grace), ("--shrink-seconds", a.shrink_seconds),
                    ("--startup-seconds", a.startup_seconds)):
        if v is not None and v <= 0:
            p.error(f"{name} must be positive, got {v}")
    if a.seed is None:
        a.seed = int(datetime.date.today().strftime("%Y%m%d"))
    a.worker = shlex.split(a.worker_cmd) if a.worker_cmd else [sys.executable, "-m", "overlapcheck"]
    if a.shared_db:
        from overlapcheck.fuzz.db import SharedDatabaseError, connect_redis
        try:
            connect_redis(a.shared_db).close()
        except SharedDatabaseError as e:
            p.error(f"--shared-db: {e}")
    if not a.worker:
        p.error("--worker-cmd is empty")
    return a


def tail(path: str, lines: int = 60, chars: int = 6000) -> str:
    try:
        with open(path, errors="replace") as fh:
            text = fh.read()
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-chars:]


def files_under(root: str, top: str):
    out = []
    for d, _, names in os.walk(root):
        out += sorted(os.path.relpath(os.path.join(d, n), top) for n in names)
    return out


def run_group(cmd, stdout: str, stderr, timeout: float, env=None):
    """Run ``cmd`` in its own process group (``stderr`` None: into ``stdout``'s file);
    kill that group on timeout. Returns (exit code or None on timeout, wall seconds)."""
    t0 = time.monotonic()
    with open(stdout, "w") as fo, open(stderr or os.devnull, "w") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe if stderr else subprocess.STDOUT, env=env,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except BaseException:   # timeout, or this job cancelled: end the worker's group
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
                try:
                    os.killpg(p.pid, sig)
                    p.wait(timeout=wait)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
            if sys.exc_info()[0] is not subprocess.TimeoutExpired:
                raise
            rc = None
    return rc, round(time.monotonic() - t0, 2)


def load_json(path: str):
    try:
        with open(path) as fh:
            text = fh.read()
        start = text.find("{")
        return json.loads(text[start:]) if start >= 0 else None
    except (OSError, ValueError):
        return None


def describe_exit(rc) -> tuple:
    """(status, signal name or None) of a worker exit code (None: timed out)."""
    if rc is None:
        return "timeout", None
    if rc < 0 or rc > 128:
        num = -rc if rc < 0 else rc - 128
        try:
            return "crash", signal.Signals(num).name
        except ValueError:
            return "crash", None
    return ("clean" if rc == 0 else "findings" if rc == 1 else "error"), None


def campaign(a, i: int, model: str, seconds: float, out: str, share_left: float = float("inf")) -> dict:
    """One campaign of ``seconds``; ``share_left``: what is left of its model's share
    (the grace past the time box is capped by it, never under the shrink time)."""
    seed = a.seed + i
    name = f"c{i:02d}-{re.sub(r'[^A-Za-z0-9.-]+', '_', model)}-s{seed}"
    repros = os.path.join(out, "repros", name)
    logs = {k: os.path.join(out, "logs", f"{name}.{k}") for k in ("stdout", "stderr")}
    cmd = a.worker + ["fuzz", "--device", a.device, "--time", f"{seconds:g}", "--seed", str(seed),
                      "--model", model, "--jobs", str(a.jobs), "--out", repros,
                      "--db", os.path.join(out, "hypothesis-db"), "--json"]
    if a.shared_db:
        cmd[-1:-1] = ["--db", a.shared_db]
    shrink = a.shrink_seconds or max(10.0, seconds / 4)
    cmd += ["--shrink-time", f"{shrink:g}"] + [x for f in a.fault for x in ("--fault", f)]
    if device_info(a.device).gpu:   # graphs keep the detector (declared accesses): §4.9
        cmd.append("--cuda-graphs")
    grace = a.grace if a.grace is not None else max(60.0, seconds)
    grace = min(grace, max(shrink, share_left - seconds))   # docs/design.md §6.9: fair shares
    rc, wall = run_group(cmd, logs["stdout"], logs["stderr"], seconds + grace)
    summary = load_json(logs["stdout"]) if rc in (0, 1) else None
    status, sig = describe_exit(rc)
    if rc in (0, 1) and not isinstance(summary, dict):
        status = "crash"      # an uncaught exception also exits 1, without a summary
    shown = shlex.join(cmd)
    if a.shared_db:
        shown = shown.replace(a.shared_db, _without_password(a.shared_db))
    rec = {"name": name, "command": shown, "seed": seed, "model": model,
           "time_box_s": seconds, "grace_s": round(grace, 1), "exit_code": rc, "signal": sig, "status": status,
           "wall_s": wall, "examples": None, "steps": None, "findings": [],
           "logs": {k: os.path.relpath(v, out) for k, v in logs.items()}}
    if isinstance(summary, dict):
        rec["examples"], rec["steps"] = summary.get("examples"), summary.get("steps")
        for f in summary.get("findings", []):
            repro = f.get("repro")
            rec["findings"].append({
                "id": f.get("id"), "kind": "checker", "checker": f.get("checker"),
                "text": f.get("text") or "",
                "repro": repro, "trace": repro[:-5] + ".trace.json" if repro else None,
                "reproduce": f"overlapcheck replay {repro}" if repro else rec["command"]})
    if status in ("crash", "timeout", "error"):
        err = tail(logs["stderr"])
        rec["findings"].append({
            "id": f"worker-{status}-{name}", "kind": status, "exit_code": rc, "signal": sig,
            "cuda_fatal": bool(CUDA_FATAL.search(err)), "seed": seed, "model": model,
            "reproduce": rec["command"], "stderr_tail": err,
            "repros": files_under(repros, out)})
    return rec


def find_sanitizer(name: str):
    found = shutil.which(name)
    if found is None and os.sep not in name:
        found = shutil.which(os.path.join("/usr/local/cuda/bin", name))
    return found


def sanitizer_pass(a, out: str, seconds: float) -> dict:
    exe = None if a.no_sanitizer else find_sanitizer(a.sanitizer)
    if exe is None:
        why = "--no-sanitizer" if a.no_sanitizer else f"{a.sanitizer} is not on PATH"
        return {"verdict": "skipped", "note": f"memcheck pass skipped: {why}"}
    sdir = os.path.join(out, "sanitizer")
    os.makedirs(sdir, exist_ok=True)
    cmd = [exe, "--tool", "memcheck", "--track-stream-ordered-races", "all",
           "--target-processes", "all", "--print-limit", "200"] + a.worker + [
        "fuzz", "--device", a.device, "--examples", str(a.sanitizer_examples), "--seed",
        str(a.seed), "--model", a.sanitizer_model, "--out", os.path.join(sdir, "repros"), "--json"]
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    log = os.path.join(sdir, "sanitizer.log")
    rc, wall = run_group(cmd, log, None, seconds, env)
    m = SUMMARY_RE.findall(tail(log, lines=10 ** 6, chars=10 ** 8))
    errors = int(m[-1]) if m else None
    verdict = ("timeout" if rc is None else "no-summary" if errors is None
               else "clean" if errors == 0 else "errors")
    return {"verdict": verdict, "errors": errors, "exit_code": rc, "wall_s": wall,
            "command": "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync " + shlex.join(cmd),
            "log": os.path.relpath(log, out), "log_tail": tail(log, lines=40, chars=4000),
            "device": a.device}


def write_summary(out: str, doc: dict) -> None:
    tmp = os.path.join(out, "summary.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, os.path.join(out, "summary.json"))


def _without_password(url):
    """A database address fit for the summary (no credentials)."""
    if not url:
        return None
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()


def per_model(doc: dict, share: float) -> dict:
    """Campaigns, wall seconds, examples, steps and findings per model (every model named,
    those that got no campaign too)."""
    out = {}
    for m in doc["models"]:
        cs = [c for c in doc["campaigns"] if c["model"] == m]
        out[m] = {"campaigns": len(cs), "share_s": round(share, 1),
                  "seconds": round(sum(c["wall_s"] for c in cs), 1),
                  "examples": sum(c["examples"] or 0 for c in cs),
                  "steps": sum(c["steps"] or 0 for c in cs),
                  "findings": sum(len(c["findings"]) for c in cs),
                  "crashes": sum(f["kind"] != "checker" for c in cs for f in c["findings"])}
    return out


def preflight_cuda() -> None:
    code = "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    if subprocess.run([sys.executable, "-c", code]).returncode != 0:
        sys.stderr.write("nightly_gpu: error: --device cuda but torch sees no CUDA GPU\n")
        sys.exit(2)


def main(argv=None) -> int:
    a = parse_args(argv)
    out = a.out
    for d in ("", "repros", "logs", "hypothesis-db"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    if device_info(a.device).gpu and a.worker_cmd is None:
        preflight_cuda()
    start, total = time.monotonic(), a.minutes * 60.0
    sanitize = not a.no_sanitizer and find_sanitizer(a.sanitizer) is not None
    reserve = min(a.sanitizer_seconds, max(60.0, 0.35 * total)) if sanitize else 0.0
    share = (total - reserve) / len(a.models)          # docs/design.md §6.9: equal shares
    per = a.campaign_seconds or min(600.0, max(30.0, share))
    floor = min(per, 15.0, max(1.0, share - a.startup_seconds))   # the shortest box worth a start
    used = {m: 0.0 for m in a.models}
    doc = {"schema": 1, "device": a.device, "seed": a.seed, "models": a.models, "faults": a.fault,
           "shared_db": _without_password(a.shared_db),
           "budget_minutes": a.minutes, "share_s": round(share, 1),
           "argv": sys.argv[1:] if argv is None else list(argv),
           "started": datetime.datetime.now().isoformat(timespec="seconds"),
           "campaigns": [], "sanitizer": None, "per_model": {}, "totals": {}}
    i = 0
    try:
        ran = True
        while ran:                 # rounds: each model with share left gets one campaign
            ran = False
            for model in a.models:
                if a.max_campaigns is not None and i >= a.max_campaigns:
                    break
                left = total - reserve - (time.monotonic() - start)
                mine = share - used[model]
                box = min(per, mine - a.startup_seconds, left - a.startup_seconds)
                if box < floor:
                    continue       # this model's share (or the budget) is spent
                rec = campaign(a, i, model, round(box, 1), out, mine - a.startup_seconds)
                used[model] += rec["wall_s"]
                doc["campaigns"].append(rec)
                doc["per_model"] = per_model(doc, share)
                print(f"[{time.monotonic() - start:7.1f}s] {rec['name']}: {rec['status']} "
                      f"(exit {rec['exit_code']}), {rec['examples']} examples, "
                      f"{len(rec['findings'])} finding(s); {model}: {used[model]:.0f} of {share:.0f} s",
                      flush=True)
                write_summary(out, doc)
                i, ran = i + 1, True
        left = total - (time.monotonic() - start)
        doc["sanitizer"] = sanitizer_pass(a, out, max(left, 60.0) if sanitize else 0.0)
        print(f"sanitizer: {doc['sanitizer']['verdict']}"
              + (f" ({doc['sanitizer']['errors']} errors)" if doc["sanitizer"].get("errors") else "")
              + (f" - {doc['sanitizer']['note']}" if "note" in doc["sanitizer"] else ""), flush=True)
    finally:
        cs = doc["campaigns"]
        findings = [f for c in cs for f in c["findings"]]
        doc["totals"] = {
            "campaigns": len(cs), "seconds": round(time.monotonic() - start, 1),
            "examples": sum(c["examples"] or 0 for c in cs), "steps": sum(c["steps"] or 0 for c in cs),
            "findings": len(findings), "crashes": sum(f["kind"] != "checker" for f in findings),
            "by_status": {s: sum(c["status"] == s for c in cs) for s in sorted({c["status"] for c in cs})},
            "sanitizer_errors": (doc["sanitizer"] or {}).get("errors")}
        doc["per_model"] = per_model(doc, share)
        write_summary(out, doc)
    for m, pm in doc["per_model"].items():
        print(f"  {m}: {pm['campaigns']} campaign(s), {pm['examples']} examples, {pm['steps']} steps, "
              f"{pm['seconds']:.0f} of {pm['share_s']:.0f} s, {pm['findings']} finding(s)")
    bad = doc["totals"]["findings"] or (doc["sanitizer"] or {}).get("verdict") in ("errors", "no-summary")
    print(f"nightly: {len(doc['campaigns'])} campaign(s), {doc['totals']['findings']} finding(s) "
          f"({doc['totals']['crashes']} crash/timeout); summary in {os.path.join(out, 'summary.json')}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
