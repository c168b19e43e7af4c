"""vLLM's own V2 GPU model runner (``runner: real``) under the run driver: a clean run
takes vLLM's CUDA path on the CPU shim and the detector stays quiet, each runner fault
is reported by stream-race at vLLM's lines and is silent without its trigger, and the
config and strategy hold what the real runner needs (skipped where vLLM is missing;
the config and strategy tests run everywhere).

Cost with vLLM (2 shared cores): about 60-90 s for the module, most of it vLLM's
import and the first runner build of the process (each run builds its runner:
about 2 s)."""
import pytest
from hypothesis import HealthCheck, given, settings

from overlapcheck.protocol.types import GREEDY, SEEDED, RequestSpec
from overlapcheck.protocol.workload import Workload
from overlapcheck.targets.vllm import FAULTS, VllmTarget, VllmTargetConfig
from overlapcheck.targets.vllm.strategies import cases

REAL = dict(runner="real", block_size=16, num_blocks=16, max_model_len=64, vocab=32,
            spec_tokens=2, long_prefill_token_threshold=0, max_num_batched_tokens=64)
WL = Workload((RequestSpec(0, 0, (3, 5, 7, 9, 3, 5), 10, (), 0, GREEDY),
               RequestSpec(1, 0, (4, 4, 4, 4), 12, (), 0, GREEDY),
               RequestSpec(2, 1, (1, 2, 3, 1, 2, 3, 1), 8, (), 7, SEEDED)), ())


# -- config, faults and strategy: no vLLM needed ---------------------------------------------
def test_real_runner_config_says_what_it_needs():
    cfg = VllmTargetConfig.from_dict({"runner": "real"})
    assert cfg.runner == "real" and cfg.block_size == 16 and cfg.vocab == 32
    for bad in (dict(batch_queue=3), dict(block_size=8), dict(defer_block_free=True)):
        with pytest.raises(ValueError) as e:
            VllmTargetConfig(**dict(REAL, **bad))
        assert "\n" not in str(e.value) and "real runner" in str(e.value)
    with pytest.raises(ValueError, match="runner must be one of"):
        VllmTargetConfig(runner="gpu")
    with pytest.raises(ValueError, match="needs runner: real"):
        VllmTargetConfig(faults=("uva-staging-reused",))


def test_runner_faults_are_listed_with_their_layer():
    runner = {n for n, f in FAULTS.items() if f.to_dict()["layer"] == "runner"}
    assert runner == {"async-output-drops-refs", "output-read-before-event",
                      "uva-staging-reused"}
    for n in runner:
        d = FAULTS[n].to_dict()
        assert d["checker"] == "stream-race" and "vLLM #" in d["pr"] and d["sites"] != [""]


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(cases(config={"runner": "real"}))
def test_pinned_cases_keep_the_real_runner_and_draw_the_rest(case):
    cfg = case.config
    assert cfg.runner == "real" and cfg.batch_queue <= 2 and cfg.block_size % 16 == 0
    assert len(case.workload.requests) <= 4
    VllmTarget().check_workload(case.workload, cfg)


# -- the real runner ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm():
    from overlapcheck.targets.vllm import env
    env.prepare_environment()       # TRITON_INTERPRET before vLLM's and Triton's import
    pytest.importorskip("vllm")
    pytest.importorskip("triton")
    VllmTarget().version()


def _run(faults=(), checks=(), **kw):
    from overlapcheck.run import Case, ScheduleSpec, execute
    cfg = VllmTargetConfig(**dict(REAL, **kw))
    return execute(Case(cfg, WL, ScheduleSpec("stalls", 0, ()), tuple(checks), tuple(faults),
                        "vllm"))


def test_the_real_runner_runs_vllms_cuda_path_watched_and_clean(vllm, monkeypatch):
    """Clean: no race, no Triton launch left undeclared, and no host synchronization
    but the runner's own: ``copy_event.synchronize()`` in ``get_output``, and the
    blocking copies of ``BlockTables``' construction (as on a GPU). A host sync only
    the CPU path had would order the host after the streams and hide races."""
    import traceback

    from overlapcheck.device.sched import Eager
    from overlapcheck.watch.tracker import Tracker
    sites = set()
    for name in ("sync_stream", "sync_event", "sync_device"):
        orig = getattr(Tracker, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            frames = [f for f in traceback.extract_stack() if "/vllm/" in f.filename]
            sites.add((_name, frames[-1].filename.split("/vllm/")[-1] if frames else "?"))
            return _orig(self, *a, **k)
        monkeypatch.setattr(Tracker, name, counted)
    t = VllmTarget()
    s = t.open(VllmTargetConfig(**REAL), Eager(), None)
    res = s.run(WL)
    assert sites == {("sync_event", "v1/worker/gpu/async_utils.py"),
                     ("sync_stream", "v1/worker/gpu/block_table.py")}, sites
    assert all(r.finish_reason in ("length", "stop") for r in res.requests.values())
    assert max(a for r in res.requests.values() for a in r.accept_lens) > 1   # drafts accepted
    assert s.race_reports == []
    # every Triton launch declared or twinned, no host sync of the whole device
    assert not s.launches.interpreted and sum(s.launches.twin.values()) > 0
    assert s.syncs.accelerator == 0
    out = _run()
    assert out.findings == [], [str(f) for f in out.findings]


@pytest.mark.parametrize("fault", ["async-output-drops-refs", "output-read-before-event",
                                   "uva-staging-reused"])
def test_each_runner_fault_is_reported_by_stream_race(vllm, fault):
    out = _run((fault,), ("stream-race", "lifecycle"))
    checkers = {f.checker for f in out.findings}
    assert "stream-race" in checkers, [str(f) for f in out.findings]


def test_runner_faults_are_silent_without_their_trigger(vllm):
    # one batch in flight at a time: every output is taken before the next step
    # stages its writes or allocates, so neither early reuse nor the single staging
    # buffer can race; the read before the event still does (it needs no overlap)
    for fault in ("async-output-drops-refs", "uva-staging-reused"):
        out = _run((fault,), ("stream-race", "lifecycle"), batch_queue=1)
        assert out.findings == [], (fault, [str(f) for f in out.findings])


def test_greedy_tokens_are_the_tiny_llamas_own_continuation(vllm):
    """The real runner's forward (its Triton attention through the twins, its paged
    KV, its sampler and rejection sampler) against transformers' Llama on the same
    checkpoint, one request at a time with no engine: every greedy token agrees."""
    import torch

    from overlapcheck.device.sched import Eager
    from overlapcheck.targets.sglang.golden import _hf_llama
    s = VllmTarget().open(VllmTargetConfig(**REAL), Eager(), None)
    res = s.run(WL)
    model = _hf_llama(REAL["vocab"], REAL["max_model_len"])
    for spec in WL.requests:
        if spec.sampling != GREEDY:
            continue
        toks = list(spec.prompt)
        with torch.no_grad():
            for _ in res.requests[spec.rid].tokens:
                logits = model(torch.tensor([toks])).logits
                toks.append(int(logits[0, -1].argmax()))
        assert tuple(toks[len(spec.prompt):]) == res.requests[spec.rid].tokens


def test_a_process_that_imported_vllm_compiled_gets_one_line(vllm, tmp_path):
    """vLLM imported before the target set ``TRITON_INTERPRET=1`` has compiled kernels,
    whose helpers the interpreter refuses mid-run: the real runner says so in one line
    (exit 2 from the command line) instead of an interpreter error at the first sample."""
    import os
    import subprocess
    import sys
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import os, sys\n"
        "os.environ['VLLM_TARGET_DEVICE'] = 'cpu'\n"
        "import vllm.v1.worker.gpu.sample.gumbel\n"
        "from overlapcheck.cli import main\n"
        "sys.exit(main(['run', '--target', 'vllm', '--requests', '2', '--seed', '1',\n"
        "               '--config', sys.argv[1]]))\n")
    cfg = tmp_path / "real.yaml"
    cfg.write_text("runner: real\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    p = subprocess.run([sys.executable, str(prog), str(cfg)], capture_output=True, text=True,
                       env=env, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 2, p.stdout + p.stderr
    # (vLLM's own import, done by the program, may log a line of its own first)
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("overlapcheck")]
    assert len(ours) == 1 and "TRITON_INTERPRET=1" in ours[0], p.stderr
    assert "Traceback" not in p.stderr
