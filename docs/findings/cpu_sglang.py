"""What the finding reproductions need to import SGLang where it was installed for the
CPU (no torchvision, whose PyPI build links a CUDA torch). Imports nothing of
overlapcheck; with a real torchvision installed it does nothing."""
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


def stand_in_for_torchvision() -> None:
    """SGLang's config package imports torchvision at module level (multimodal helpers);
    a CPU install of SGLang may lack it. An empty stand-in lets the import finish; no
    code this script runs uses it. A real torchvision, when installed, is left alone."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    # transformers caches whether torchvision exists when first asked: ask while it is
    # really absent, so the stand-in is never taken for a release
    from transformers.utils import import_utils
    import_utils.is_torchvision_available()

    class Empty(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "torchvision":
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            m = Empty(spec.name)
            m.__path__ = []
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())
