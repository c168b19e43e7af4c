"""The selftest catalogue on the sim (every case under every schedule), its metadata,
the judge, the sanitizer subprocess protocol, and the ``overlapcheck selftest`` CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from overlapcheck.race import KINDS
from overlapcheck.selftest import runner, sanitizer
from overlapcheck.selftest.cases import ANNOTATION, catalogue

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = catalogue()
HAS_CUDA = torch.cuda.is_available()


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "overlapcheck", "selftest", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", list(CASES))
def test_case_verdict_on_sim(name):
    v = runner.run_case(CASES[name], "sim", seed=0)
    assert v.ok, f"{name}: {v.problems}\n{runner.first_report(v.runs) or ''}"
    assert v.detected == CASES[name].expect_race
    assert len(v.runs) == len(runner.schedules("sim", 0)) > 4


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.expect_race][:6])
def test_planted_race_flagged_under_another_seed(name):
    v = runner.run_case(CASES[name], "sim", seed=9001)
    assert v.ok and v.detected, v.problems


def test_catalogue_shape():
    races = [c for c in CASES.values() if c.expect_race]
    twins = [c for c in CASES.values() if not c.expect_race]
    assert len(races) >= 12 and len(twins) >= 12
    assert sum(not c.annotated for c in CASES.values()) * 2 >= len(CASES)
    assert any(ANNOTATION in c.kinds for c in races)
    for c in CASES.values():
        other = CASES[c.twin]
        assert other.twin == c.name and other.expect_race != c.expect_race
        assert other.sanitizer == c.sanitizer
        assert "\n" not in c.description and c.description
        assert set(c.kinds) <= set(KINDS) | {ANNOTATION}
        assert bool(c.kinds) == c.expect_race


class _Spy:
    """A runtime stand-in that notes whether any launch declared its accesses."""

    def __init__(self, rt):
        self._rt = rt
        self.annotated = False

    def __getattr__(self, name):
        return getattr(self._rt, name)

    def launch(self, *args, reads=None, writes=None, **kwargs):
        self.annotated |= reads is not None or writes is not None
        return self._rt.launch(*args, reads=reads, writes=writes, **kwargs)


@pytest.mark.parametrize("name", list(CASES))
def test_annotated_flag_matches_program(name):
    from overlapcheck.device import AnnotationError, make_runtime
    spy = _Spy(make_runtime("sim", seed=0, strategy="eager"))
    try:
        CASES[name].run(spy)
        spy.synchronize()
    except AnnotationError:
        pass
    assert spy.annotated == CASES[name].annotated


def test_judge_rejects_flagged_twin_and_schedule_dependence():
    twin = next(c for c in CASES.values() if not c.expect_race)
    race = CASES[twin.twin]
    flagged = runner.Run("eager", 0, True, ("stream-stream",))
    clean = runner.Run("random", 1, False, ())
    assert not runner.judge(twin, [flagged]).ok
    assert not runner.judge(race, [flagged, clean]).ok
    wrong_kind = runner.Run("eager", 0, True, ("host-stream",))
    assert not runner.judge(CASES["accept_lens_read_before_copy_done"], [wrong_kind]).ok
    broken = runner.Run("eager", 0, False, (), error="ValueError: boom")
    assert not runner.judge(twin, [broken]).ok


def test_judge_uses_sanitizer_only_on_stream_cases():
    ss = CASES["future_map_resolve_without_stash_event"]
    run = runner.Run("-", 0, True, ("stream-stream",))
    assert runner.judge(ss, [run], sanitizer="flagged").ok
    assert not runner.judge(ss, [run], sanitizer="not flagged").ok
    assert not runner.judge(ss, [run], sanitizer="error: boom").ok
    host = CASES["accept_lens_read_before_copy_done"]
    assert runner.judge(host, [runner.Run("-", 0, True, ("host-read-before-copy",))],
                        sanitizer="n/a").ok


def test_sanitizer_output_parsing():
    assert sanitizer.parse(0, 'noise\n{"case": "x", "flagged": true}\n', "") == "flagged"
    assert sanitizer.parse(0, '{"case": "x", "flagged": false}', "") == "not flagged"
    assert sanitizer.parse(3, '{"error": true, "message": "Boom: x"}', "") == "error: Boom: x"
    assert sanitizer.parse(2, "", "m: error: CUDA is not available\n") == \
        "error: m: error: CUDA is not available"


@pytest.mark.skipif(HAS_CUDA, reason="checks the error path without CUDA")
def test_sanitizer_child_without_cuda_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", sanitizer.MODULE,
                           "future_map_resolve_without_stash_event"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "CUDA is not available" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_cli_sim_passes():
    proc = _cli("--device", "sim")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("selftest sim: PASS") and f"0/{len(CASES) // 2} twins" in last


def test_cli_unknown_device_is_usage_error():
    proc = _cli("--device", "nope")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "nope" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.skipif(HAS_CUDA, reason="checks the error path without CUDA")
def test_cli_cuda_without_cuda_is_usage_error():
    proc = _cli("--device", "cuda")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_cli_json():
    proc = _cli("--json", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["failed"] == 0 and doc["seed"] == 3
    assert {c["case"] for c in doc["cases"]} == set(CASES)


def test_cli_bad_flag_and_unknown_case():
    assert _cli("--seed", "x").returncode == 2
    proc = _cli("--case", "no_such_case")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
def test_cli_cuda_passes():
    # Includes one PyTorch CUDA sanitizer subprocess per stream<->stream case.
    proc = _cli("--device", "cuda")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _emulated_sanitizer(case) -> bool:
    """Does PyTorch's CUDA sanitizer flag ``case``? Its own race logic
    (``torch.cuda._sanitizer.EventHandler``) is fed, in host issue order, by an eager sim
    whose device buffers stand in for CUDA tensors; allocation poison-fills on the
    allocating stream, as on cuda. This checks the catalogue's ``sanitizer`` column
    without a GPU."""
    import torch.cuda._sanitizer as csan
    from torch.utils._python_dispatch import TorchDispatchMode

    from overlapcheck.device import DEVICE
    from overlapcheck.device.sched import Eager
    from overlapcheck.device.sim import SimRuntime

    handler, errors = csan.EventHandler(), []

    class Args(csan.ArgumentHandler):
        def __init__(self, rt):
            super().__init__()
            self.rt = rt

        def _handle_argument(self, value, is_write, metadata_only, name=None, is_output=False):
            if not isinstance(value, torch.Tensor):
                return
            buf = self.rt._by_storage.get(value.untyped_storage().data_ptr())
            if buf is None or buf.space != DEVICE:
                return  # host memory: invisible to the sanitizer
            ptr = value.data_ptr()
            if is_write:
                self.dataptrs_written.add(ptr)
            elif not metadata_only:
                self.dataptrs_read.add(ptr)
            self.tensor_aliases.setdefault(ptr, [])
            if is_output:
                self.outputs.add(ptr)

    class OnStream(TorchDispatchMode):
        def __init__(self, rt, ctx):
            super().__init__()
            self.rt, self.ctx = rt, ctx

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            factory = bool(csan.FACTORY_FUNCTION_REGEX.match(func._schema.name))
            h = Args(self.rt)
            h.parse_inputs(func._schema, args, kwargs, is_factory=factory)
            out = func(*args, **kwargs)
            h.parse_outputs(func._schema, out, is_factory=factory)
            errors.extend(handler._handle_kernel_launch(
                self.ctx, h.dataptrs_read - h.dataptrs_written, h.dataptrs_written,
                h.outputs, func._schema, h.tensor_aliases))
            return out

    class Emulated(SimRuntime):
        def new_stream(self, name):
            s = super().new_stream(name)
            handler._handle_stream_creation(s.ctx)
            return s

        def empty(self, shape, dtype, name, stream):
            buf = super().empty(shape, dtype, name, stream)
            handler._handle_memory_allocation(buf.t.data_ptr())
            with OnStream(self, stream.ctx):
                buf.t.fill_(0)
            return buf

        def _retire(self, s):
            with OnStream(self, s.ctx):
                super()._retire(s)

        def _record(self, event, stream):
            super()._record(event, stream)
            handler._handle_event_record(event.id, stream.ctx)

        def _wait_event(self, stream, event):
            super()._wait_event(stream, event)
            if event.last is not None:  # a never-recorded CUDA event is never created
                handler._handle_event_wait(event.id, stream.ctx)

        def _sync_event(self, event):
            super()._sync_event(event)
            if event.last is not None:
                handler._handle_event_synchronization(event.id)

        def _sync_stream(self, stream):
            super()._sync_stream(stream)
            handler._handle_stream_synchronization(stream.ctx)

        def synchronize(self):
            super().synchronize()
            handler._handle_device_synchronization()

    rt = Emulated(Eager(), detect=False)
    case.run(rt)
    rt.synchronize()
    return bool(errors)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.sanitizer])
def test_sanitizer_column_matches_pytorch_sanitizer_logic(name):
    assert _emulated_sanitizer(CASES[name]) == CASES[name].expect_race


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.sanitizer])
def test_pytorch_sanitizer_logic_blind_to_host_and_allocator_cases(name):
    # What only overlapcheck's detector sees: host-side races and allocator reuse.
    assert not _emulated_sanitizer(CASES[name])


def test_catalogue_runs_the_sanitizer_checks_beside_the_cases(monkeypatch):
    # the sanitizer subprocesses run on a pool while the cases run; each verdict gets its
    # own case's answer, in catalogue order
    asked = []

    def fake_check(name):
        asked.append(name)
        case = runner.select([name])[0]
        return "flagged" if case.expect_race != (name == wrong) else "not flagged"
    stream_cases = [c for c in runner.select() if c.sanitizer]
    assert len(stream_cases) >= 2
    wrong = stream_cases[-1].name
    monkeypatch.setattr(sanitizer, "check", fake_check)
    names = [c.name for c in runner.select()][:6] + [wrong]
    vs = runner.run_catalogue("sim", 0, names, with_sanitizer=True, jobs=2)
    assert [v.case.name for v in vs] == names
    assert sorted(asked) == sorted(n for n in names if runner.select([n])[0].sanitizer)
    for v in vs:
        if not v.case.sanitizer:
            assert v.sanitizer == "n/a"
        elif v.case.name == wrong:
            assert not v.ok and any("PyTorch CUDA sanitizer" in p for p in v.problems)
        else:
            assert v.sanitizer == ("flagged" if v.case.expect_race else "not flagged") and v.ok
