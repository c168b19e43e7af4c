"""The ``watch`` context on the CPU shim: restoring what it patched, keeping the
program's own exceptions, both modes, the JSON report, and the host accesses that
never reach the dispatcher."""
import json
import logging

import numpy as np
import pytest
import torch
import torch.cuda._gpu_trace as gpu_trace
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from overlapcheck.watch import RaceFound, watch

REGISTRIES = [v for v in vars(gpu_trace).values() if hasattr(v, "callback_list")]


@pytest.fixture(autouse=True)
def quiet_log():
    logger = logging.getLogger("overlapcheck.watch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def _snapshot():
    return ({k: v for k, v in vars(torch.Tensor).items()},
            {k: v for k, v in vars(torch.cuda).items()},
            {k: v for k, v in vars(torch).items()},
            [list(r.callback_list) for r in REGISTRIES],
            list(_get_current_dispatch_mode_stack()))


def _same(a, b) -> bool:
    ta, ca, ma, ra, sa = a
    tb, cb, mb, rb, sb = b
    return (ta.keys() == tb.keys() and all(ta[k] is tb[k] for k in ta)
            and ca.keys() == cb.keys() and all(ca[k] is cb[k] for k in ca)
            and ma.keys() == mb.keys() and all(ma[k] is mb[k] for k in ma)
            and ra == rb and sa == sb)


def read_before_copy():
    """A pinned buffer read on the host before its non-blocking D2H landed."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.empty(4, device="cuda")
        x.fill_(1.0)
        pinned = torch.empty(4, pin_memory=True)
        pinned.copy_(x, non_blocking=True)
    return pinned.tolist()


def test_leaving_restores_every_patched_function():
    before = _snapshot()
    originals = (torch.cuda.Stream, torch.cuda.Event, torch.Tensor.tolist, torch.tensor)
    with watch(device="cpu", mode="log") as w:
        inside = _snapshot()
        assert torch.cuda.Stream is not originals[0] and torch.cuda.Event is not originals[1]
        assert torch.Tensor.tolist is not originals[2] and torch.tensor is not originals[3]
        assert torch.cuda.is_available()
        read_before_copy()
    assert not _same(before, inside)
    assert _same(before, _snapshot())
    assert w.reports
    with pytest.raises(RaceFound):  # and after a race raised out of the context
        with watch(device="cpu", mode="raise"):
            read_before_copy()
    assert _same(before, _snapshot())
    with pytest.raises(KeyError):  # and after the program's own exception
        with watch(device="cpu"):
            torch.cuda.Stream()
            raise KeyError("x")
    assert _same(before, _snapshot())
    assert torch.cuda.Stream is originals[0] and torch.Tensor.tolist is originals[2]


def test_program_exception_is_kept_and_the_report_added_as_a_note():
    boom = ValueError("boom")
    with pytest.raises(ValueError) as info:
        with watch(device="cpu", mode="log") as w:
            read_before_copy()
            raise boom
    assert info.value is boom
    assert len(w.reports) == 1
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and "overlapcheck watch found 1 race" in notes[0]
    assert "host-read-before-copy" in notes[0]


def test_exception_without_race_gets_no_note():
    with pytest.raises(ValueError) as info:
        with watch(device="cpu", mode="log"):
            torch.zeros(2, device="cuda").tolist()
            raise ValueError("plain")
    assert not getattr(info.value, "__notes__", [])


def test_raise_mode_stops_at_the_racy_line():
    with pytest.raises(RaceFound) as info:
        with watch(device="cpu"):
            read_before_copy()
    r = info.value.report
    assert r.kind == "host-read-before-copy"
    assert r.current["op"] == "tolist"
    assert r.current["frame"].endswith(f":{read_before_copy.__code__.co_firstlineno + 8}")
    assert "`s.synchronize()`" in r.missing_edge


def test_json_report(tmp_path):
    path = tmp_path / "watch.json"
    with watch(device="cpu", mode="log", json_path=str(path)):
        read_before_copy()
        read_before_copy()
    data = json.loads(path.read_text())
    assert data["overlapcheck_watch"] == 1 and data["device"] == "cpu"
    assert data["summary"]["races"] == 1 and data["summary"]["occurrences"] == 2
    race = data["races"][0]
    assert race["kind"] == "host-read-before-copy" and race["count"] == 2
    assert race["current"]["context"] == "the host" and race["current"]["write"] is False
    assert race["previous"]["copy"] is True and race["previous"]["stream"] == "s"
    assert race["missing_edge"].startswith("add `s.synchronize()`")


def test_a_race_is_a_finding_with_a_stable_id():
    """The same race seen by two sessions is one finding id; another race is another."""
    ids = []
    def other():
        np.asarray(_copy_into_pinned()[0])

    for program in (read_before_copy, read_before_copy, other):
        with watch(device="cpu", mode="log") as w:
            program()
        (r,) = w.reports
        f = r.finding()
        assert f.checker == "watch" and f.site == r.key and f.ident == r.ident
        assert f.ident in str(r) and r.to_json()["id"] == f.ident
        ids.append(f.ident)
    assert ids[0] == ids[1] != ids[2]


def test_watch_contexts_do_not_nest():
    with watch(device="cpu"):
        with pytest.raises(RuntimeError, match="nest"):
            with watch(device="cpu"):
                pass


def _copy_into_pinned():
    s, done = torch.cuda.Stream(), torch.cuda.Event()
    with torch.cuda.stream(s):
        x = torch.arange(4, device="cuda")
        pinned = torch.empty(4, dtype=torch.int64, pin_memory=True)
        pinned.copy_(x, non_blocking=True)
    done.record(s)
    return pinned, done


@pytest.mark.parametrize("read", [
    lambda p: np.asarray(p),
    lambda p: p.numpy().tolist(),
    lambda p: p.numpy()[1],
    lambda p: p[1].item(),
    lambda p: int(p[2]),
    lambda p: bool(p[0] == 3),
    lambda p: p.sum(),
    lambda p: p[1:3].tolist(),
], ids=["np.asarray", "numpy-tolist", "numpy-index", "item", "int", "compare", "sum", "slice-tolist"])
def test_host_reads_of_pinned_memory(read):
    with watch(device="cpu", mode="log") as w:
        pinned, done = _copy_into_pinned()
        read(pinned)
    assert [r.kind for r in w.reports] == ["host-read-before-copy"]
    with watch(device="cpu", mode="log") as w:
        pinned, done = _copy_into_pinned()
        done.synchronize()
        read(pinned)
    assert w.reports == []


def test_a_numpy_view_of_pinned_memory_reads_when_it_is_read():
    """A view made before the copy lands is not a read; reading it after the copy's
    event is clean, reading it before is a race (vLLM's async_copy_to_np pattern)."""
    for sync in (True, False):
        with watch(device="cpu", mode="log") as w:
            pinned, done = _copy_into_pinned()
            view = pinned.numpy()
            head = view[:2]
            if sync:
                done.synchronize()
            assert head.tolist() == [0, 1]
        assert [r.kind for r in w.reports] == ([] if sync else ["host-read-before-copy"])


def test_writes_through_a_numpy_view_of_a_staging_buffer_are_seen():
    def program(sync: bool):
        s, done = torch.cuda.Stream(), torch.cuda.Event()
        staging = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        view = staging.numpy()
        with torch.cuda.stream(s):
            dev = torch.empty(4, dtype=torch.int64, device="cuda")
            dev.copy_(staging, non_blocking=True)
        done.record(s)
        if sync:
            done.synchronize()
        view[1:3] = [5, 6]
        np.cumsum(np.arange(4), out=view)

    with watch(device="cpu", mode="log") as w:
        program(False)
    assert [r.kind for r in w.reports] == ["host-write-during-copy"] * 2
    assert [r.rows for r in w.reports] == ["rows 1..2", "all of it"]
    with watch(device="cpu", mode="log") as w:
        program(True)
    assert w.reports == []


def test_host_writes_into_a_staging_buffer_in_flight():
    def program(sync: bool):
        s, done = torch.cuda.Stream(), torch.cuda.Event()
        staging = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        with torch.cuda.stream(s):
            dev = torch.empty(4, dtype=torch.int64, device="cuda")
            dev.copy_(staging, non_blocking=True)
        done.record(s)
        if sync:
            done.synchronize()
        staging[2] = 7

    with watch(device="cpu", mode="log") as w:
        program(False)
    assert [r.kind for r in w.reports] == ["host-write-during-copy"]
    assert w.reports[0].rows == "row 2"
    with watch(device="cpu", mode="log") as w:
        program(True)
    assert w.reports == []


def test_pageable_copies_follow_cudas_rules():
    with watch(device="cpu", mode="log") as w:
        s = torch.cuda.Stream()
        pageable = torch.zeros(4)
        with torch.cuda.stream(s):
            dev = torch.empty(4, device="cuda")
            dev.copy_(pageable, non_blocking=True)  # H2D from pageable: staged at once
            pageable.fill_(1.0)
            back = torch.empty(4)
            back.copy_(dev, non_blocking=True)      # D2H into pageable: done on return
        back.tolist()
    assert w.reports == []


def test_to_cpu_non_blocking_returns_pinned_memory_still_being_filled():
    with watch(device="cpu", mode="log") as w:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            dev = torch.arange(4, device="cuda")
            blocking = dev.cpu()
            host = dev.to("cpu", non_blocking=True)
        assert host.is_pinned() and not blocking.is_pinned()
        blocking.tolist()  # the blocking copy synchronized the stream, before ...
        host.tolist()      # ... the non-blocking one was issued
    assert [r.kind for r in w.reports] == ["host-read-before-copy"]


def test_device_tensors_stay_on_the_device_until_copied():
    with watch(device="cpu", mode="log") as w:
        x = torch.ones(3, device="cuda")
        assert x.cuda() is x and x.to("cuda") is x and x.to(x) is x
        y = torch.tensor([1, 2, 3], device="cuda")
        z = torch.as_tensor([4, 5], device="cuda")
        assert y.to(torch.float32).cpu().tolist() == [1.0, 2.0, 3.0]
        assert z.tolist() == [4, 5]
        with pytest.raises(TypeError):
            x.numpy()
    assert w.reports == []


def test_one_race_seen_on_many_tensors_says_so():
    """The same two lines racing on ten tensors are one race, on ten tensors."""
    with watch(device="cpu", mode="log") as w:
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(a):
            bufs = [torch.zeros(4 if i < 9 else 6, device="cuda") for i in range(10)]
        for t in bufs + bufs[:1]:  # the first tensor twice
            with torch.cuda.stream(b):
                t.add_(1)
    (r,) = w.reports
    assert r.count == 11 and r.tensors == 10
    text = str(r)
    line = r.previous["frame"]  # where the tensors were allocated
    first = test_one_race_seen_on_many_tensors_says_so.__code__.co_firstlineno
    assert line.endswith(f":{first + 5}")
    assert text.splitlines()[0].startswith(
        "race (stream-stream) on 10 tensors, the first `t`, device tensor float32[4] allocated")
    assert (f"(seen 11 times, on 10 tensors: 9 x device tensor float32[4] allocated at "
            f"{line}, 1 x device tensor float32[6] allocated at {line})") in text, text
    assert r.to_json()["tensors"] == 10
    assert w.summary()["tensors"] == 10 and w.summary()["occurrences"] == 11


def test_an_op_that_reads_and_writes_one_tensor_writes_it():
    """``torch.mul(x, 5, out=x)`` reads and writes ``x``: one access, a write."""
    with watch(device="cpu", mode="log") as w:
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(a):
            x = torch.zeros(4, device="cuda")
        with torch.cuda.stream(b):
            torch.mul(x, 5, out=x)
    (r,) = w.reports
    assert r.current["op"] == "mul" and r.current["write"] and r.count == 1
    assert "writes it in 'mul'" in str(r)


def test_a_tensor_is_described_as_the_code_holds_it():
    """``x`` is a [5, 2] view of a flat allocation: the report describes ``x``, and the
    rows are its rows, not the flat allocation's elements."""
    with watch(device="cpu", mode="log") as w:
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(a):
            x = torch.arange(10, device="cuda").view(5, 2)
        with torch.cuda.stream(b):
            x[0:2].add_(1)
    (r,) = w.reports
    assert r.memory.startswith("device tensor int64[5, 2] allocated at "), r.memory
    assert r.rows == "rows 0..1" and r.variable == "x"
    assert str(r).startswith("race (stream-stream) on `x`, device tensor int64[5, 2] allocated")


def _launch(schedule, forward, table):
    with torch.cuda.stream(schedule):
        indices = torch.arange(0, 2, device="cuda")
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        out = table.index_select(0, indices)
    return out  # indices is freed when this frame goes, at the caller's line


def test_reuse_advice_points_where_the_freed_tensor_still_exists():
    with watch(device="cpu", mode="log") as w:
        schedule, forward = torch.cuda.Stream(), torch.cuda.Stream()
        with torch.cuda.stream(schedule):
            table = torch.zeros(4, 8, device="cuda")
        _launch(schedule, forward, table)
        with torch.cuda.stream(schedule):
            torch.arange(2, 4, device="cuda")  # takes the freed block of indices
    (r,) = w.reports
    assert r.kind == "reuse"
    use = _launch.__code__.co_firstlineno + 5
    assert r.previous["frame"].endswith(f":{use}")
    here = r.previous["frame"].rsplit(":", 1)[0]
    freed = test_reuse_advice_points_where_the_freed_tensor_still_exists.__code__.co_firstlineno
    assert r.missing_edge.startswith(
        f"the previous owner was freed at {here}:{freed + 5} while `forward` could still use "
        f"it: call `.record_stream(forward)` on it after line {use} of {here}, where "
        f"`forward` uses it, or add"), r.missing_edge


def _fill(staging, dev):
    staging.copy_(dev, non_blocking=True)


@pytest.mark.parametrize("pinned", [
    lambda: torch.empty(4, dtype=torch.int64, pin_memory=True),
    lambda: torch.zeros(4, dtype=torch.int64).pin_memory(),
], ids=["pin_memory=True", "pin_memory()"])
def test_a_pinned_buffer_is_described_by_its_allocation(pinned):
    with watch(device="cpu", mode="log") as w:
        s = torch.cuda.Stream()
        staging = pinned()
        with torch.cuda.stream(s):
            _fill(staging, torch.arange(4, device="cuda"))  # its first copy
        staging.tolist()
    (r,) = w.reports
    made = pinned.__code__.co_firstlineno
    assert r.memory.startswith("pinned host tensor int64[4] allocated at "), r.memory
    assert r.memory.endswith(f"test_watch_session.py:{made}"), r.memory
