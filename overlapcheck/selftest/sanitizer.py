"""Run one catalogue case under PyTorch's CUDA sanitizer, in its own process.

``torch.cuda._sanitizer`` is process-wide and raises on its first error, so each
stream<->stream case runs in a fresh subprocess::

    python -m overlapcheck.selftest.sanitizer CASE_NAME

The child runs the case on the ``cuda`` backend with overlapcheck's detector off and
prints one JSON line: ``{"case": ..., "flagged": bool, "errors": n, "message": ...}``.
Exit status: 0 the case ran (flagged or not), 2 usage error (unknown case, no CUDA),
3 the case failed for another reason. ``check(name)`` is the parent side.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List, Optional

MODULE = "overlapcheck.selftest.sanitizer"
TIMEOUT_S = 300
FLAGGED, NOT_FLAGGED = "flagged", "not flagged"


def check(name: str, timeout_s: float = TIMEOUT_S) -> str:
    """Run case ``name`` under the sanitizer in a subprocess; returns ``"flagged"``,
    ``"not flagged"`` or ``"error: ..."``."""
    env = dict(os.environ)
    env["TORCH_CUDA_SANITIZER"] = "1"  # enabled at `import torch`, before any CUDA work
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run([sys.executable, "-m", MODULE, name], env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"error: timed out after {timeout_s:g}s"
    return parse(proc.returncode, proc.stdout, proc.stderr)


def parse(returncode: int, stdout: str, stderr: str) -> str:
    """The verdict from a child's exit status and output."""
    result = None
    for line in reversed(stdout.strip().splitlines()):
        try:
            result = json.loads(line)
            break
        except ValueError:
            continue
    if returncode == 0 and isinstance(result, dict) and "flagged" in result:
        return FLAGGED if result["flagged"] else NOT_FLAGGED
    why = (result or {}).get("message") if isinstance(result, dict) else None
    if not why:
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        why = tail[-1] if tail else f"exit status {returncode}"
    return f"error: {why}"


def _sanitizer_errors(exc: BaseException, errors_type) -> Optional[BaseException]:
    """The sanitizer's exception in ``exc``'s cause/context chain, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, errors_type):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _headline(text: str) -> str:
    """The first informative line of a sanitizer error (its banner is '====')."""
    for line in text.splitlines():
        line = line.strip()
        if line and set(line) != {"="}:
            return line
    return text.strip()


def _emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    """Child entry point: run one case under the sanitizer and report it."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: python -m {MODULE} CASE_NAME", file=sys.stderr)
        return 2
    name = args[0]
    from .cases import catalogue
    case = catalogue().get(name)
    if case is None:
        print(f"{MODULE}: error: unknown case {name!r}", file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print(f"{MODULE}: error: CUDA is not available; the PyTorch CUDA sanitizer "
              f"needs a GPU", file=sys.stderr)
        return 2
    import torch.cuda._sanitizer as csan
    if not csan.cuda_sanitizer.enabled:
        csan.enable_cuda_sanitizer()
    from ..device import make_runtime
    try:
        rt = make_runtime("cuda", detect=False)
        case.run(rt)
        rt.synchronize()
    except Exception as e:
        found = _sanitizer_errors(e, csan.CUDASanitizerErrors)
        if found is not None:
            errs = getattr(found, "errors", [])
            first = _headline(str(errs[0]) if errs else str(found))
            _emit(case=name, flagged=True, errors=len(errs), message=first)
            return 0
        _emit(case=name, error=True, message=f"{type(e).__name__}: {e}")
        return 3
    _emit(case=name, flagged=False, errors=0, message="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
