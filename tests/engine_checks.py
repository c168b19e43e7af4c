"""What every clean engine run must satisfy, and per-request parity between two runs
(docs/design.md §5), shared by the engine and draft-kind tests."""
from fake_models import make_model
from overlapcheck.device import make_runtime
from overlapcheck.engine import Engine

# the engine's modes as config changes, for tests that run every one
ENGINE_MODES = {
    "overlap": {},
    "no-overlap": {"overlap": False},
    "no-spec": {"spec": False},
    "zero-bubble": {"zero_bubble": True},
    "kv-backup": {"kv_backup": True},
    "verify-sync": {"verify_sync": True},
}


def run_clean(cfg, wl, seed, strategy, access="declared", observer=None):
    """Run and assert: no race report, no undeclared host sync, the pool full and
    consistent at idle."""
    rt = make_runtime("sim", seed=seed, strategy=strategy, access=access)
    eng = Engine(cfg, rt, make_model(cfg.model), observer)
    res = eng.run(wl)
    assert not rt.reports, str(rt.reports[0])
    assert rt.syncs == eng.worker.declared_syncs, "host syncs beyond the declared ones"
    assert eng.idle and eng.mem.is_full(), "pool not back to full at idle"
    eng.mem.check_integrity(eng.requests)
    return res


def assert_parity(ref, got, what, accept=True):
    """Same tokens and finish reason per request (a prefix for an aborted one) and,
    with ``accept``, the same accept lengths by the request's own verify count."""
    for rid, a in ref.requests.items():
        b = got.requests[rid]
        if "abort" in (a.finish_reason, b.finish_reason):
            n = min(len(a.tokens), len(b.tokens))
            assert a.tokens[:n] == b.tokens[:n], f"{what}: request {rid} diverges before its abort"
            continue
        assert (a.tokens, a.finish_reason) == (b.tokens, b.finish_reason), f"{what}: request {rid}"
        if accept:
            assert a.accept_lens == b.accept_lens, f"{what}: request {rid} accept lengths"


def check_parity_and_lossless(base: dict, wl, seed, model, what=""):
    """Overlap vs non-overlap (tokens and accept lengths) and spec vs no-spec (tokens)
    for one workload on config ``base``; aborted requests are skipped."""
    from overlapcheck.engine import EngineConfig
    from overlapcheck.run import run_workload
    ref = run_workload(EngineConfig(**base, overlap=False), wl, seed=seed, model=model)
    got = run_workload(EngineConfig(**base), wl, seed=seed, model=model)
    nospec = run_workload(EngineConfig(**base, spec=False), wl, seed=seed, model=model)
    assert got.summary.races == 0
    for rid, a in ref.requests.items():
        b, c = got.requests[rid], nospec.requests[rid]
        if "abort" in (a.finish_reason, b.finish_reason, c.finish_reason):
            continue
        assert (a.tokens, a.accept_lens) == (b.tokens, b.accept_lens), f"parity {what} {rid}"
        assert a.tokens == c.tokens, f"lossless {what} {rid}"


def twins_agree(case):
    """``case`` on the sim with its kernels' host twins and without: the same status,
    digest, choices, results and findings; the twins' outcome."""
    from overlapcheck.run import execute
    outs = []
    for twins in (True, False):
        rt = make_runtime("sim", strategy=case.schedule.make(), access="declared")
        rt.host_runs = twins
        outs.append(execute(case, runtime=rt))
    a, b = outs
    assert a.status == b.status and a.digest == b.digest
    assert a.choices == b.choices and a.result == b.result
    assert [f.key for f in a.findings] == [f.key for f in b.findings]
    return a
