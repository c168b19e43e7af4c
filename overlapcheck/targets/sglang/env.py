"""The import environment of the SGLang target: its pin, the environment variables it
needs and the import stubs for CUDA-only modules.

SGLang is imported lazily, inside ``SglangTarget.open``/``version`` only. Its import
pulls in two modules that a CPU install cannot provide:

* ``torchvision``: imported at module level by SGLang's multimodal helpers (InternVL,
  DeepSeek-OCR configs), which the scheduler's import graph reaches. The PyPI build of
  torchvision is linked against CUDA torch, so it cannot be installed beside the CPU
  torch. No scheduler code path calls it.
* ``vllm._custom_ops``: ``RotaryEmbedding.__init__`` imports ``rotary_embedding`` from
  it on any platform that is neither CUDA, HIP nor SGLang's CPU engine; the torch-native
  rotary path it then takes never calls it.

Each is stubbed only when it is not installed, and only while SGLang is imported and a
scheduler is built (``stubbed()``): afterwards ``sys.modules`` holds no fake module, so
a user's real install (or a later real import) is untouched. Every attribute of a stub
is a placeholder that raises when called, so a use we did not foresee fails loudly.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Dict, Iterator, List

PACKAGE = "sglang"
PINNED = "0.5.23"
INSTALL = ("bash overlapcheck/targets/sglang/install-cpu.sh (sglang==0.5.23 and the "
           "packages its scheduler imports, beside the CPU torch)")

# Set inside the target before SGLang is imported (it reads most of them at import).
ENV: Dict[str, str] = {
    "HF_HUB_OFFLINE": "1",              # the tiny model is a local config dir; never the hub
    "TRANSFORMERS_OFFLINE": "1",
    "SGLANG_USE_CPU_ENGINE": "0",       # the plain torch path, not the AMX CPU engine
    "SGLANG_IS_IN_CI": "0",             # keeps SGLang's torch.compile'd debug asserts off
    "SGLANG_USE_MESSAGE_QUEUE_BROADCASTER": "0",
    # Triton kernels become interpreted functions when they are defined: the real spec
    # workers' launches then reach their CPU twins (twins.py), or the interpreter
    "TRITON_INTERPRET": "1",
    # no progress bar per checkpoint load (tqdm reads this when it is imported)
    "TQDM_DISABLE": "1",
}

STUBBED_ROOTS = ("torchvision", "vllm")


class _Placeholder:
    """An attribute of a stub module: any attribute of it is another placeholder;
    calling it raises; it can serve as a base class (a stubbed transform class)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is an overlapcheck import stub (not installed)")

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = frozenset(roots)

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


def missing_roots() -> List[str]:
    """The stubbed packages that are really absent (only those get a stub)."""
    out = []
    for root in STUBBED_ROOTS:
        if root in sys.modules and not isinstance(sys.modules[root], _StubModule):
            continue
        if importlib.util.find_spec(root) is None:
            out.append(root)
    return out


def set_environment() -> None:
    """The variables of ``ENV`` the user has not set: before SGLang, Triton or
    transformers (which imports Triton through torch._dynamo) is imported."""
    for k, v in ENV.items():
        os.environ.setdefault(k, v)


@contextlib.contextmanager
def stubbed() -> Iterator[None]:
    """Install the stubs for the missing CUDA-only modules; remove them (and every
    module they produced) on exit."""
    set_environment()
    roots = missing_roots()
    if "torchvision" in roots:
        # transformers caches whether torchvision exists the first time it asks; ask
        # now, while it really is absent, so the stub is never mistaken for a release.
        from transformers.utils import import_utils
        import_utils.is_torchvision_available()
    finder = _StubFinder(roots)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n, m in sys.modules.items() if isinstance(m, _StubModule)]:
            del sys.modules[name]
