"""Where a real engine's own log lines go while overlapcheck drives it.

SGLang logs its construction, its warnings and a progress bar per checkpoint load to
the terminal: about 2,000 lines in a one-minute campaign, burying the campaign's
progress and findings. A command that wants them elsewhere names a file in the
environment (``OVERLAPCHECK_ENGINE_LOG``, inherited by a campaign's worker processes;
``{pid}`` in it becomes the process id); a target wraps the engine's work in
``routed()``, which for the duration of the block sends the root logger's and
transformers' records, Python warnings and what is written to ``sys.stderr`` (progress
bars) to that file (appended), and restores them after. Without the variable nothing
changes. overlapcheck's own progress and findings are printed between runs, outside
the block: they stay on the terminal.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, Optional

ENV_VAR = "OVERLAPCHECK_ENGINE_LOG"
LOGGERS = ("", "transformers")       # root (SGLang's handler sits there) and transformers'


def path() -> Optional[str]:
    p = os.environ.get(ENV_VAR)
    return p.replace("{pid}", str(os.getpid())) if p else None


@contextlib.contextmanager
def routed() -> Iterator[None]:
    """The engine's log records and warnings go to ``path()`` during the block."""
    p = path()
    if not p:
        yield
        return
    os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    handler = logging.FileHandler(p, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("[%(asctime)s %(name)s %(levelname)s] %(message)s"))
    saved = []
    for name in LOGGERS:
        lg = logging.getLogger(name)
        saved.append((lg, list(lg.handlers)))
        lg.handlers = [handler]
    captured = logging._warnings_showwarning is not None     # captureWarnings' own flag
    logging.captureWarnings(True)
    try:
        with open(p, "a", encoding="utf-8") as raw, contextlib.redirect_stderr(raw):
            yield
    finally:
        logging.captureWarnings(captured)
        for lg, handlers in saved:
            lg.handlers = handlers
        handler.close()


def route_to(out_dir: str, target: str) -> str:
    """Name ``out_dir/engine-logs/<target>-{pid}.log`` the engine log of this process and
    the processes it starts (unless the environment already names one); the pattern."""
    pattern = os.environ.get(ENV_VAR)
    if not pattern:
        pattern = os.path.join(out_dir, "engine-logs", f"{target}-{{pid}}.log")
        os.environ[ENV_VAR] = pattern
    return pattern
