"""A kernel's host run held to the kernel (docs/design.md §3.4, "One source per kernel").

Where nothing intercepts a launch, the sim runs a kernel's host run (``fn.host_run``)
on numpy views of its tensors: the kernel's own source, written once against
``device/xp.py`` (``fn.host_run is fn``), or a *twin* (a second implementation,
``xp.twin``) where one earns its place (none does in the engine today). Two rules keep
the host run honest:

* A host run that raises is never passed over in silence. The kernel then runs on the
  tensors with the same inputs: where it raises too, that is the engine's error (numpy
  refused what torch refuses); where it runs, the two disagree and ``TwinMismatch`` is
  raised (a finding, like any exception out of a run). Only ``NoTwin`` (no host path for
  these arguments, e.g. a model without a host mirror) leaves the work to the kernel.
* In a checked run (``twins="check"``, drawn by the fuzzer in a fixed share of its
  examples) every host-run launch runs both: on numpy views of the arguments, then the
  kernel on the arguments as they were before, and every tensor argument and the return
  value must be equal, element for element. The run goes on with the kernel's result:
  a checked run executes the source a GPU executes, on the tensors.
"""
from __future__ import annotations

import inspect
from typing import Callable, List, Optional

import numpy as np
import torch

TWIN_MODES = ("run", "check", "off")    # run twins; run both and compare; kernels only


class NoTwin(Exception):
    """Raised by a twin that has no path for these arguments: its kernel runs instead."""


class TwinMismatch(Exception):
    """A kernel's host run (its twin, or its one source on numpy) and the kernel on
    torch disagreed on the same inputs."""

    def __init__(self, kernel: str, what: str, one_source: bool = False):
        runs = "on numpy and on torch" if one_source else "and its host twin"
        super().__init__(f"kernel '{kernel}' {runs} disagree: {what}")
        self.kernel, self.what = kernel, what
        self.finding_site = f"kernel {kernel}"     # one finding per kernel (run.driver)


def _name(fn) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else name


def _arg_names(fn, n: int) -> List[str]:
    """The names of ``fn``'s first ``n`` positional parameters (``#i`` where unknown)."""
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"#{i}" for i in range(n)]


def _plain(v):
    return v.item() if hasattr(v, "item") else v


def _differs(a, b) -> Optional[str]:
    """Where kernel output ``a`` and twin output ``b`` differ (None: equal)."""
    if (type(a) is torch.Tensor and type(b) is torch.Tensor and a.dtype == b.dtype
            and a.shape == b.shape and torch.equal(a, b)):
        return None         # the common case, in one C call
    if isinstance(a, torch.Tensor) or isinstance(b, np.ndarray):
        x = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        y = b.detach().cpu().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
        if x.shape != y.shape:
            return f"shape {tuple(x.shape)} vs {tuple(y.shape)}"
        same = (x == y)
        if x.dtype.kind in "fc" or y.dtype.kind in "fc":
            same = same | (np.isnan(x) & np.isnan(y))
        if same.all():
            return None
        at = tuple(int(i) for i in np.argwhere(~same)[0])
        return (f"{int((~same).sum())} element(s) differ, first at {list(at)}: "
                f"kernel {_plain(x[at])!r}, twin {_plain(y[at])!r}")
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if len(a) != len(b):
            return f"{len(a)} values vs {len(b)}"
        for i, (u, v) in enumerate(zip(a, b)):
            d = _differs(u, v)
            if d is not None:
                return f"value {i}: {d}"
        return None
    try:
        equal = bool(a == b)
    except Exception:     # noqa: BLE001 - values that cannot be compared are different
        equal = False
    return None if equal else f"kernel {a!r}, twin {b!r}"


def twin_failed(fn: Callable, args, kwargs, failed: Exception):
    """The host run of kernel ``fn`` raised ``failed``: the same inputs go to the kernel
    on the tensors, whose own error stands where it fails too (a twin refuses before any
    write, as torch does; a one-source kernel fails at the same statement on both);
    where it runs, ``TwinMismatch``. ``NoTwin``: the kernel's result."""
    if isinstance(failed, NoTwin):
        return fn(*args, **kwargs)
    fn(*args, **kwargs)
    twin = getattr(fn, "host_run", None)
    raise _mismatch(fn, twin, f"{_host(fn, twin)} raised {type(failed).__name__}: "
                              f"{failed}; the kernel ran") from failed


def _host(fn, twin) -> str:
    """What the host run ``twin`` of kernel ``fn`` is called in a mismatch."""
    return "the numpy run" if twin is fn else "the twin"


def _mismatch(fn, twin, what: str) -> TwinMismatch:
    return TwinMismatch(_name(fn), what, one_source=twin is fn)


def check_twin(fn: Callable, twin: Callable, args, views, kwargs):
    """Run twin and kernel on the same inputs, compare every tensor argument and the
    return value, and keep the kernel's (``TwinMismatch`` where they differ)."""
    tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    before = [a.clone() for _, a in tensors]
    twin_err = None
    try:
        twin_out = twin(*views, **kwargs)
    except NoTwin:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - judged against the kernel below
        twin_out, twin_err = None, e
    # what the twin left: copies (it wrote through views of the kernel's memory)
    twin_out = _detached(twin_out)
    after_twin = [a.clone() for _, a in tensors]
    for (_, a), b in zip(tensors, before):
        a.copy_(b)
    try:
        out = fn(*args, **kwargs)
    except Exception as e:
        if twin_err is not None:
            raise        # both refuse these inputs: the kernel's error, where it happened
        raise _mismatch(fn, twin, f"the kernel raised {type(e).__name__}: {e}; "
                                  f"{_host(fn, twin)} ran") from e
    if twin_err is not None:
        raise _mismatch(fn, twin, f"{_host(fn, twin)} raised {type(twin_err).__name__}: "
                                  f"{twin_err}; the kernel ran") from twin_err
    problems: List[str] = []
    names = _arg_names(fn, len(args))
    for (i, a), t in zip(tensors, after_twin):
        d = _differs(a, t)
        if d is not None:
            problems.append(f"'{names[i]}' ({list(a.shape)} "
                            f"{str(a.dtype).replace('torch.', '')}): {d}")
    d = _differs(out, twin_out) if not (out is None and twin_out is None) else None
    if d is not None:
        problems.append(f"return value: {d}")
    if problems:
        raise _mismatch(fn, twin, "; ".join(problems[:3]))
    return out


def _detached(x):
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_detached(v) for v in x)
    return x
