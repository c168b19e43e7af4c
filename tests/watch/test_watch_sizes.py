"""Ops whose output size depends on device data (``watch/sized.py``): the host waits for
the stream only to learn the size, and the kernels that re-read the input and write the
output are queued after that wait. Each case runs on the CPU shim and, with CUDA, on
the GPU backend: a later write of the input (or read of the output) from another stream
without an edge is a race; with the edge it is not; where the host really waited for the
whole op, or did not wait at all, the verdict says so too."""
import logging

import pytest
import torch

from overlapcheck.watch import watch
from sized_inputs import ids as _ids, mask as _mask, ngrams as _ngrams, rows as _rows

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def quiet_log():
    logger = logging.getLogger("overlapcheck.watch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def _put(vals, mask, src):
    vals[mask] = src


def _put_scalar(vals, idx):
    vals[idx] = 5.0


# (id, inputs, op, which input the other stream then writes, the op named in the report)
INPUT_RACES = [
    ("nonzero", lambda: (_ids(),), lambda x: x.nonzero(), 0, "nonzero"),
    ("argwhere", lambda: (_ids(),), torch.argwhere, 0, "nonzero"),
    ("where(cond)", lambda: (_mask(),), torch.where, 0, "nonzero"),
    ("x[mask] reads x", lambda: (_rows(), _mask()), lambda v, m: v[m], 0, "index"),
    ("x[mask] reads mask", lambda: (_rows(), _mask()), lambda v, m: v[m], 1, "index"),
    ("x[host index]", lambda: (_rows(), torch.tensor([2, 0])), lambda v, i: v[i], 0, "index"),
    ("masked_select", lambda: (_ids()[:4], _mask()), torch.masked_select, 0, "masked_select"),
    ("x[mask] = y writes x", lambda: (_rows(), _mask(), torch.ones(3, 2, device="cuda")),
     _put, 0, "index_put_"),
    ("x[mask] = y reads y", lambda: (_rows(), _mask(), torch.ones(3, 2, device="cuda")),
     _put, 2, "index_put_"),
    ("x[index] = scalar", lambda: (_rows(), torch.tensor([1, 3], device="cuda")),
     _put_scalar, 0, "index_put_"),
    ("unique(dim=0)", lambda: (_ngrams(),), lambda x: torch.unique(x, dim=0), 0, "unique_dim"),
    ("unique_consecutive(dim=0)", lambda: (_ngrams(),),
     lambda x: torch.unique_consecutive(x, dim=0), 0, "unique_consecutive"),
    ("repeat_interleave", lambda: (torch.tensor([2, 1, 3], device="cuda"),),
     torch.repeat_interleave, 0, "repeat_interleave"),
    ("x.repeat_interleave(repeats)", lambda: (_ids()[:3], torch.tensor([2, 1, 3], device="cuda")),
     torch.repeat_interleave, 1, "repeat_interleave"),
    ("bincount", lambda: (_ids(),), torch.bincount, 0, "bincount"),
    ("bincount weights", lambda: (_ids(), torch.ones(5, device="cuda")),
     torch.bincount, 1, "bincount"),
]

# (id, inputs, op returning the output the other stream then reads, the op in the report)
OUTPUT_RACES = [
    ("nonzero", lambda: (_ids(),), lambda x: x.nonzero(), "nonzero"),
    ("x[mask]", lambda: (_rows(), _mask()), lambda v, m: v[m], "index"),
    ("masked_select", lambda: (_ids()[:4], _mask()), torch.masked_select, "masked_select"),
    ("unique(dim=0) values", lambda: (_ngrams(),),
     lambda x: torch.unique(x, dim=0, return_counts=True)[0], "unique_dim"),
    ("unique(dim=0) counts", lambda: (_ngrams(),),
     lambda x: torch.unique(x, dim=0, return_counts=True)[1], "unique_dim"),
    ("repeat_interleave", lambda: (torch.tensor([2, 1, 3], device="cuda"),),
     torch.repeat_interleave, "repeat_interleave"),
    ("bincount", lambda: (_ids(),), torch.bincount, "bincount"),
]

# the host waited for all of the op: the other stream needs no edge to touch it
WHOLE_OP_WAITED = [
    ("unique", lambda x: torch.unique(x)),
    ("unique all outputs", lambda x: torch.unique(x, return_inverse=True, return_counts=True)[1]),
    ("unique(sorted=False)", lambda x: torch.unique(x, sorted=False)),
    ("unique_consecutive", lambda x: torch.unique_consecutive(x, return_counts=True)[1]),
    ("item", lambda x: x.sum().item()),
    ("equal", lambda x: torch.equal(x, x + 1)),
]


def _two_streams():
    return torch.cuda.Stream(), torch.cuda.Stream()


def _forward_then_schedule(make, op, after, fixed: bool):
    """Inputs made on the schedule stream, ``op`` on the forward stream, then
    ``after(inputs, result)`` on the schedule stream (after a wait with ``fixed``)."""
    forward, schedule = _two_streams()
    with torch.cuda.stream(schedule):
        ins = make()
    forward.wait_stream(schedule)
    with torch.cuda.stream(forward):
        out = op(*ins)
    if fixed:
        schedule.wait_stream(forward)
    with torch.cuda.stream(schedule):
        after(ins, out)


def _reports(device, body):
    with watch(device=device, mode="log") as w:
        body()
    return w.reports


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make, op, target, name",
                         [pytest.param(*c[1:], id=c[0]) for c in INPUT_RACES])
def test_input_read_after_the_size_wait(device, make, op, target, name):
    def run(fixed):
        return _reports(device, lambda: _forward_then_schedule(
            make, op, lambda ins, out: ins[target].fill_(0), fixed))

    reports = run(False)
    assert [r.kind for r in reports] == ["stream-stream"], "\n".join(map(str, reports))
    prev = reports[0].previous
    assert prev["op"] == name and prev["after_wait"], reports[0]
    assert f"the host waited inside '{name}'" in str(reports[0])
    assert run(True) == []


@pytest.mark.parametrize("device", DEVICES)
def test_a_host_mask_is_no_wait_and_its_index_an_ordinary_kernel(device):
    """``x[host_mask]``: the mask's ``nonzero`` runs on the host and the indices reach
    the device by a pageable copy that does not wait for it (as the CUDA runtime calls
    show), so the host is not ordered after the forward stream: a later write of ``x``
    from the schedule stream races the index kernel, with no wait to name."""
    def run(fixed):
        return _reports(device, lambda: _forward_then_schedule(
            lambda: (_rows(), torch.tensor([True, False, True, True])), lambda v, m: v[m],
            lambda ins, out: ins[0].fill_(0), fixed))

    reports = run(False)
    assert [r.kind for r in reports] == ["stream-stream"], "\n".join(map(str, reports))
    assert reports[0].previous["op"] == "index" and not reports[0].previous["after_wait"]
    assert "the host waited inside" not in str(reports[0])
    assert run(True) == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make, op, name", [pytest.param(*c[1:], id=c[0]) for c in OUTPUT_RACES])
def test_output_written_after_the_size_wait(device, make, op, name):
    def run(fixed):
        return _reports(device, lambda: _forward_then_schedule(
            make, op, lambda ins, out: out.clone(), fixed))

    reports = run(False)
    assert [r.kind for r in reports] == ["stream-stream"], "\n".join(map(str, reports))
    assert reports[0].previous["op"] == name and reports[0].previous["write"]
    assert run(True) == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", [pytest.param(c[1], id=c[0]) for c in WHOLE_OP_WAITED])
def test_ops_the_host_waited_for_whole_need_no_edge(device, op):
    def after(ins, out):
        ins[0].fill_(0)
        if isinstance(out, torch.Tensor):
            out.clone()

    assert _reports(device, lambda: _forward_then_schedule(
        lambda: (_ids(),), op, after, fixed=False)) == []


@pytest.mark.parametrize("device", DEVICES)
def test_unique_dim_writes_its_inverse_before_the_wait(device):
    op = lambda x: torch.unique(x, dim=0, return_inverse=True)[1]
    assert _reports(device, lambda: _forward_then_schedule(
        lambda: (_ngrams(),), op, lambda ins, out: out.clone(), False)) == []


@pytest.mark.parametrize("device", DEVICES)
def test_nonzero_of_a_strided_view_reads_its_copy_after_the_wait(device):
    """``nonzero`` copies a non-contiguous input before the wait: the input itself is
    not read after it, the result still is written after it."""
    strided = lambda: (torch.arange(6, device="cuda").reshape(2, 3),)
    assert _reports(device, lambda: _forward_then_schedule(
        strided, lambda x: x.t().nonzero(), lambda ins, out: ins[0].fill_(0), False)) == []
    reports = _reports(device, lambda: _forward_then_schedule(
        strided, lambda x: x.t().nonzero(), lambda ins, out: out.clone(), False))
    assert [r.previous["op"] for r in reports] == ["nonzero"]


def _host_reads_a_copy_behind(device, op):
    """A non-blocking copy into pinned memory on the forward stream, then ``op`` there,
    then the host reads the pinned buffer: ordered only if ``op`` made the host wait."""
    def body():
        forward = torch.cuda.Stream()
        with torch.cuda.stream(forward):
            ids = _ids()
            pinned = torch.empty(5, dtype=torch.int64, pin_memory=True)
            pinned.copy_(ids, non_blocking=True)
            op(ids)
        pinned.tolist()
    return [r.kind for r in _reports(device, body)]


NO_WAIT = [
    ("x[mask] = scalar (masked_fill_)",
     lambda x: x.__setitem__(x > 1, 0)),
    ("repeat_interleave(output_size=)",
     lambda x: torch.repeat_interleave(x, output_size=int(6))),
    ("x[device index]", lambda x: x[x.clamp(0, 4)]),
    ("nonzero_static", lambda x: torch.nonzero_static(x, size=2)),
    ("equal, other shapes", lambda x: torch.equal(x, x[:2])),
]
WAITS = [
    ("nonzero", lambda x: x.nonzero()),
    ("x[mask]", lambda x: x[x > 1]),
    ("x[mask] = y", lambda x: x.__setitem__(x > 1, torch.zeros(2, dtype=x.dtype,
                                                              device="cuda"))),
    ("repeat_interleave", lambda x: torch.repeat_interleave(x)),
    ("bincount", torch.bincount),
    ("unique", torch.unique),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", [pytest.param(c[1], id=c[0]) for c in NO_WAIT])
def test_ops_that_do_not_wait_leave_the_host_unordered(device, op):
    assert _host_reads_a_copy_behind(device, op) == ["host-read-before-copy"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", [pytest.param(c[1], id=c[0]) for c in WAITS])
def test_the_wait_orders_the_host_after_the_work_queued_before(device, op):
    assert _host_reads_a_copy_behind(device, op) == []
