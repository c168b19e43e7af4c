"""``overlapcheck run``: run a workload through an engine (the reference engine, or
with ``--target`` vLLM's or SGLang's real scheduler) and print, per request, the output
tokens, finish reason and accept lengths, then a summary.

Every checker of ``invariants`` runs after every step (``--check`` picks some); their
violations are printed. ``--log FILE`` writes the event stream as JSON lines.
``--tp N`` runs N tensor-parallel ranks: logical ranks on the sim, or with ``--dist``
N ``torch.distributed`` processes whose decisions are compared each step.

Exit codes: 0 clean, 1 violations or race reports, 2 bad input.
"""
from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    from ..device import ACCESS_MODES, DEVICES, STRATEGIES
    from ..engine.config import FUTURE_MAPS, RESERVE_RULES
    from ..engine.drafts import DRAFT_KINDS
    from .. import targets
    p = subparsers.add_parser("run", help="run a workload through an engine, every checker on",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="reference", metavar="NAME",
                   help=f"the engine: {', '.join(targets.TARGETS)} (default reference; the "
                        f"flags below from --device to --dist-timeout are its options)")
    p.add_argument("--config", metavar="FILE.yaml",
                   help="a target's config as a YAML mapping (default: its defaults)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--requests", type=int, metavar="N",
                     help="generate N requests from --seed (default 16)")
    src.add_argument("--workload", metavar="FILE.yaml", help="load the workload from a YAML file")
    p.add_argument("--seed", type=int, default=0, help="run seed (workload, schedule)")
    p.add_argument("--device", default="sim", choices=tuple(DEVICES))
    p.add_argument("--model", default="oracle", metavar="MODEL", type=_model_name,
                   help="oracle, oracle-hostlens, tiny, trained, hf:DIR (HF-format "
                        "Llama/Qwen directory) or random:NAME (e.g. random:qwen3-0.6b)")
    p.add_argument("--draft", default="standalone", choices=tuple(DRAFT_KINDS),
                   help="draft kind (standalone model, EAGLE-style head, frozen-KV MTP)")
    p.add_argument("--spec-steps", type=int, default=3, metavar="K")
    p.add_argument("--page-size", type=int, default=1, metavar="P")
    p.add_argument("--pool-tokens", type=int, default=512, metavar="T")
    p.add_argument("--row-width", type=int, default=128, metavar="W")
    p.add_argument("--max-running", type=int, default=8, metavar="R")
    p.add_argument("--chunk-size", type=int, default=32, metavar="C")
    p.add_argument("--draft-reserve", default="double", choices=RESERVE_RULES)
    p.add_argument("--no-overlap", action="store_true", help="process each batch right after launch")
    p.add_argument("--no-spec", action="store_true", help="plain decode, one token per step")
    p.add_argument("--verify-sync", action="store_true",
                   help="the host waits for each verify to compute seq_lens_sum (spec v2 "
                        "before no-verify-sync; default: summed on the device)")
    p.add_argument("--kv-backup", action="store_true",
                   help="back decode KV up to a host pool on its own stream")
    p.add_argument("--zero-bubble", action="store_true",
                   help="draft each next round right after the draft-extend; the next "
                        "decode restores the drafts instead of drafting")
    p.add_argument("--future-map", default="row", choices=FUTURE_MAPS,
                   help="FutureMap index: by request-pool row, or slots of a ring handed out "
                        "by a running counter (SGLang's)")
    p.add_argument("--topk", type=int, default=1, metavar="N",
                   help="draft candidates kept per depth; above 1, tree drafts verified "
                        "under a tree mask (standalone and eagle drafts)")
    p.add_argument("--forward-thread", action="store_true",
                   help="launch batches on a forward thread fed through queues, the two host "
                        "threads interleaved by the sim's schedule (one rank)")
    p.add_argument("--prefix-cache", action="store_true",
                   help="keep a radix tree of committed prefixes over KV pages (lock counts, "
                        "LRU eviction); generated workloads then share prefixes")
    p.add_argument("--tp", type=_ranks, default=1, metavar="N",
                   help="tensor-parallel ranks (logical ranks on the sim; see --dist)")
    p.add_argument("--dist", action="store_true",
                   help="run the --tp ranks as torch.distributed processes (gloo on CPU, "
                        "NCCL on cuda) and compare their decisions each step")
    p.add_argument("--dist-timeout", type=float, default=120.0, metavar="S",
                   help="with --dist: seconds before a collective or the run gives up")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="cuda: replay the model calls from CUDA graphs (the race detector "
                        "then takes declared accesses only: not with --access infer)")
    p.add_argument("--schedule", default="random", metavar="STRATEGY",
                   help=f"sim schedule strategy: {', '.join(STRATEGIES)}")
    p.add_argument("--access", default="declared", choices=ACCESS_MODES,
                   help="race detector access mode (infer: intercept every op)")
    p.add_argument("--twins", default="run", choices=("run", "check", "off"),
                   help="sim: run the kernels on numpy views of their tensors (run), "
                        "each against the kernel on the tensors with the same inputs "
                        "(check: a disagreement is a finding), or on the tensors only (off)")
    p.add_argument("--check", default="all", metavar="NAMES",
                   help="comma-separated checkers to run (default all)")
    p.add_argument("--log", metavar="FILE", help="write the event stream as JSON lines")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def _model_name(text: str) -> str:
    """The *form* of a model name (argparse type); the model is resolved later."""
    import argparse
    from ..engine.config import EngineConfig
    try:
        EngineConfig(model=text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _ranks(text: str) -> int:
    """``--tp`` (argparse type): a positive number of ranks."""
    import argparse
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of ranks, got {text!r}")
    return n


def _checks(text: str):
    from invariants import REGISTRY
    from ..errors import UsageError
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or names == ["all"]:
        return []
    bad = [n for n in names if n not in REGISTRY]
    if bad:
        raise UsageError(f"unknown checker {bad[0]!r} (choose from {', '.join(REGISTRY)})")
    return names


def _config(args):
    from ..engine.config import EngineConfig
    return EngineConfig(page_size=args.page_size, pool_tokens=args.pool_tokens,
                        row_width=args.row_width, max_running=args.max_running,
                        chunk_size=args.chunk_size, spec_steps=args.spec_steps,
                        draft_reserve=args.draft_reserve, overlap=not args.no_overlap,
                        spec=not args.no_spec, model=args.model, draft_kind=args.draft,
                        tp=args.tp, verify_sync=args.verify_sync, kv_backup=args.kv_backup,
                        zero_bubble=args.zero_bubble, future_map=args.future_map,
                        topk=args.topk, forward_thread=args.forward_thread,
                        prefix_cache=args.prefix_cache)


# the flags that configure the reference engine (``_config``), with their defaults
_REFERENCE_FLAGS = ("device", "model", "draft", "spec_steps", "page_size", "pool_tokens",
                    "row_width", "max_running", "chunk_size", "draft_reserve", "no_overlap",
                    "no_spec", "verify_sync", "kv_backup", "zero_bubble", "future_map", "topk", "tp", "dist",
                    "cuda_graphs", "access", "forward_thread", "prefix_cache", "twins")


def _target_config(args, target):
    """A non-reference target's config: its defaults, or ``--config`` (YAML); the
    reference engine's flags are an error there."""
    from ..errors import UsageError
    defaults = vars(_defaults())
    given = [f for f in _REFERENCE_FLAGS if getattr(args, f) != defaults[f]]
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} configures the reference engine; "
                         f"give target {target.name}'s config with --config FILE.yaml")
    if not args.config:
        return target.default_config()
    return read_config(args.config, target)[1]


def read_config(path: str, target):
    """``(fields, config)`` of a target's config file (a YAML mapping of config
    fields, the rest defaulted); every problem is a one-line ``UsageError``."""
    import yaml
    from ..errors import UsageError
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise UsageError(f"{path}: not valid YAML") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a mapping of {target.name} config fields")
    unknown = sorted(set(map(str, doc)) - target.config_fields())
    if unknown:
        raise UsageError(f"{path}: unknown field {unknown[0]!r} of the {target.name} config")
    try:
        return doc, target.config_from_dict(doc)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{path}: {e}") from None


def _defaults():
    import argparse
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    register(sub)
    return p.parse_args(["run"])


def run(args) -> int:
    from .. import targets
    from ..errors import UsageError
    from ..protocol.target import TargetUnavailable
    try:
        target = targets.get(args.target)
        target.version()
    except ValueError as e:
        raise UsageError(str(e)) from None
    except TargetUnavailable as e:
        raise UsageError(str(e)) from None
    if args.target == "reference":
        if args.config:
            raise UsageError("--config gives another target's config; the reference engine "
                             "takes its flags")
        return _run_reference(args)
    return _run_target(args, target)


def _workload(args, cfg, target):
    from ..errors import UsageError
    from ..protocol.workload import WorkloadError, load
    from ..resources import TooLarge, check_fits
    from .case import REQUEST_BYTES
    if args.requests is not None and args.requests < 1:
        raise UsageError(f"--requests must be >= 1, got {args.requests}")
    if args.requests is not None:
        try:
            check_fits(args.requests * REQUEST_BYTES, f"--requests {args.requests}: a run "
                                                      f"of {args.requests} requests")
        except TooLarge as e:
            raise UsageError(str(e)) from None
    try:
        wl = load(args.workload, cfg) if args.workload else target.generate(
            args.seed, args.requests or 16, cfg)
        target.check_workload(wl, cfg)
        return wl
    except WorkloadError as e:
        raise UsageError(str(e)) from None


def _run_target(args, target) -> int:
    from ..device import STRATEGIES
    from ..errors import UsageError
    from .case import Case, ScheduleSpec
    from .driver import execute
    checks = _checks(args.check)
    cfg = _target_config(args, target)
    if args.schedule not in STRATEGIES:
        raise UsageError(f"unknown schedule {args.schedule!r} (choose from {', '.join(STRATEGIES)})")
    wl = _workload(args, cfg, target)
    case = Case(cfg, wl, ScheduleSpec(args.schedule, args.seed), tuple(checks), (), target.name)
    meta = {"seed": args.seed, "target": target.name, "engine_version": target.version(),
            "schedule": args.schedule, "config": target.config_to_dict(cfg)}
    return _report(args, execute(case, trace=False, log=_log(args, meta)), meta)


def _log(args, meta):
    from invariants.runlog import RunLog
    from ..errors import UsageError
    from ..outputs import output_file
    if args.log:
        output_file(args.log, "--log")
    try:
        return RunLog(args.log, meta) if args.log else None
    except OSError as e:
        raise UsageError(f"cannot write {args.log}: {e.strerror}") from None


def _run_reference(args) -> int:
    from ..errors import UsageError
    from ..device import STRATEGIES, check_available, device_info, make_runtime
    from fake_models import make_model
    from .. import targets
    from .driver import execute
    from .case import Case, ScheduleSpec

    checks = _checks(args.check)
    try:
        cfg = _config(args)
        info = device_info(args.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.schedule not in STRATEGIES:
        raise UsageError(f"unknown schedule {args.schedule!r} (choose from {', '.join(STRATEGIES)})")
    if args.dist and not (0 < args.dist_timeout <= 86400):   # nan fails both
        raise UsageError(f"--dist-timeout must be a positive number of seconds (at most a "
                         f"day), got {args.dist_timeout}")
    _check_config_fits(cfg)
    wl = _workload(args, cfg, targets.get("reference"))
    if args.dist:
        from .dist import run_command
        return run_command(args, cfg, wl, checks)
    if cfg.tp > 1 and not info.host_flags:
        raise UsageError(f"logical tensor-parallel ranks need the sim device, not "
                         f"{args.device!r}; use --dist for real ranks")
    try:
        check_available(args.device)
        rt = make_runtime(args.device, seed=args.seed, strategy=args.schedule,
                          access=args.access, graphs=args.cuda_graphs, twins=args.twins)
    except (RuntimeError, ValueError) as e:
        raise UsageError(str(e).replace("CUDA graphs need", "--cuda-graphs needs")
                         .replace("CUDA graphs hide", "--cuda-graphs hides")) from None
    if info.cpu_work:
        # thousands of tiny CPU ops per step: intra-op threads only add contention
        import torch
        torch.set_num_threads(1)
    meta = {"seed": args.seed, "device": args.device, "schedule": args.schedule,
            "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}}
    log = _log(args, meta)
    try:
        model = make_model(cfg.model)
    except ValueError as e:   # fake_models.hf.ModelError: one line naming the file or tensor
        raise UsageError(str(e)) from None
    from ..protocol.workload import WorkloadError, check_vocab
    try:
        check_vocab(wl, getattr(model, "vocab", None), cfg.model)
    except WorkloadError as e:
        raise UsageError(f"{args.workload}: {e}" if args.workload else str(e)) from None
    _check_config_fits(cfg, getattr(model, "kv_width", 3))
    case = Case(cfg, wl, ScheduleSpec(args.schedule, args.seed), tuple(checks))
    return _report(args, execute(case, runtime=rt, model=model, log=log, trace=False,
                                 tick=_Progress(wl)), meta)


# the reference engine's size flags, by config field
_SIZE_FLAGS = {"pool_tokens": "--pool-tokens", "max_running": "--max-running",
               "row_width": "--row-width", "chunk_size": "--chunk-size", "tp": "--tp"}


def _check_config_fits(cfg, kv_width: int = 3) -> None:
    """One line naming the size flag when the engine of ``cfg`` could not fit in this
    machine's memory, before anything is allocated."""
    from ..errors import UsageError
    from ..resources import TooLarge, check_fits
    from ..engine.config import largest_size
    try:
        check_fits(cfg.footprint(kv_width), "the engine")
    except TooLarge as e:
        field = largest_size(cfg, kv_width)
        raise UsageError(f"{_SIZE_FLAGS[field]} {getattr(cfg, field)}: {e}") from None


class _Progress:
    """A long run's progress on stderr: for a workload of ``BIG`` requests or more, a
    line before it starts; then every 5 s, the step of parity's reference run or of the
    checked run against the last arrival's. A short run prints nothing."""

    BIG = 1000

    def __init__(self, wl, every: float = 5.0):
        import time
        self.every, self._clock = every, time.monotonic
        self.last = max((r.arrival for r in wl.requests), default=0)
        self.next = self._clock() + every
        self.step, self.run = -1, 1
        if len(wl.requests) >= self.BIG:
            print(f"run: {len(wl.requests)} requests, the last arriving at step {self.last}",
                  file=sys.stderr, flush=True)

    def __call__(self, step: int) -> None:
        if step < self.step:        # parity's reference run has ended: the checked run
            self.run += 1
        self.step = step
        now = self._clock()
        if now >= self.next:
            self.next = now + self.every
            print(f"run: step {step} of run {self.run} (parity's reference run, then the "
                  f"checked run; arrivals until step {self.last})", file=sys.stderr,
                  flush=True)


def _report(args, out, meta) -> int:
    """Print the result, the races and the violations; the exit code."""
    res, found = out.result, out.violations
    if args.json:
        doc = res.to_json() if res is not None else {"requests": [], "summary": None}
        doc["run"] = dict(meta, status=out.status)
        doc["races"] = [r.to_json() for r in out.races]
        doc["violations"] = [v.to_json() for v in found]
        doc["problems"] = [f.text for f in out.problems]
        print(json.dumps(doc, sort_keys=True, indent=1))
    else:
        if res is not None:
            print(res.text())
        else:
            print(f"run {out.status} at step {out.steps}")
        for rep in out.races[:5]:
            print(rep, file=sys.stderr)
        for v in found:
            print(v)
        for f in out.problems:
            print(f.text)
        if found:
            print(f"{len(found)} violation(s)")
    return 1 if (found or out.races or out.problems) else 0
