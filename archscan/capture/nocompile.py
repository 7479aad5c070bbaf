"""Keep torch's compiler stack (``torch._dynamo``) from loading in an analysis that compiles nothing.

Nothing in a scan is compiled, yet importing ``torch._dynamo`` costs about 0.6 s of a 2 s
process (it pulls sympy, ``torch.distributed.tensor`` and FSDP with it). Two places in torch
reach for it anyway:

* ``FakeTensorMode.__init__`` imports ``torch._dynamo.config`` and its dispatch reads
  ``torch._dynamo.config._custom_ops_profile``: only the config module is needed, and it is a
  self-contained file (it imports ``torch.utils._config_module`` and nothing of dynamo).
* ``torch._disable_dynamo`` wrappers (every infrastructure ``TorchDispatchMode.__torch_dispatch__``,
  the refs' ``out_wrapper``...) import ``torch._dynamo`` on their first call to build
  ``torch._dynamo.disable(fn)``, and cache it on ``fn.__dynamo_disable``.

``install()`` loads ``torch/_dynamo/config.py`` under its own name and puts a stand-in for the
package in ``sys.modules``. The stand-in has the real ``config`` and a ``disable`` that returns a
shim: while dynamo is not loaded nothing can be compiling, so "disable dynamo" has nothing to
disable and the shim calls ``fn`` itself; once dynamo is loaded the shim swaps in the real
``torch._dynamo.disable(fn)``. Any other use of the stand-in (``torch.compile``, ``torch.export``,
``from torch._dynamo.source import ...``) loads the real package in its place, so everything after
that runs as it always did: the stand-in is a delay, not a replacement.

It touches torch internals, so it checks them first and does nothing (today's path, same
results) when torch is not as expected; ``tests/test_nocompile.py`` fails loudly when a new
torch changes them. Only the console entry installs it: a library caller's process is left as
it was.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
import types

_NAME = "torch._dynamo"
_EVAL_FRAME = "torch._dynamo.eval_frame"  # what runs compiled frames


def expected() -> list[str]:
    """What ``install`` relies on in this torch; empty when all of it is there."""
    import torch
    import torch._compile
    from torch._subclasses.fake_tensor import FakeTensorMode

    missing = []
    if not os.path.isfile(_config_path()):
        missing.append("torch/_dynamo/config.py")
    try:
        wrapper = inspect.getsource(torch._compile._disable_dynamo)
        init = inspect.getsource(FakeTensorMode.__init__)
    except (OSError, TypeError):
        return missing + ["torch sources (inspect.getsource failed)"]
    if "__dynamo_disable" not in wrapper or "torch._dynamo.disable(" not in wrapper:
        missing.append("torch._compile._disable_dynamo caching torch._dynamo.disable(fn) on fn.__dynamo_disable")
    if "import torch._dynamo.config" not in init:
        missing.append("FakeTensorMode.__init__ importing torch._dynamo.config")
    return missing


def _config_path() -> str:
    import torch

    return os.path.join(os.path.dirname(torch.__file__), "_dynamo", "config.py")


def installed() -> bool:
    """The stand-in is in place (the real ``torch._dynamo`` has not loaded)."""
    return isinstance(sys.modules.get(_NAME), _Standin)


def install() -> bool:
    """Put the stand-in in place; False (and nothing changed) when dynamo is already loaded or
    this torch is not as ``expected()`` says."""
    if _NAME in sys.modules or f"{_NAME}.config" in sys.modules or expected():
        return False
    import torch

    spec = importlib.util.spec_from_file_location(f"{_NAME}.config", _config_path())
    config = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = config
    try:
        spec.loader.exec_module(config)
    except Exception:
        del sys.modules[spec.name]
        return False
    standin = _Standin(config)
    sys.modules[_NAME] = standin
    torch._dynamo = standin
    sys.meta_path.insert(0, _FINDER)
    return True


def _real() -> types.ModuleType:
    """The real ``torch._dynamo``, loaded in place of the stand-in when it is still there."""
    module = sys.modules.get(_NAME)
    if not isinstance(module, _Standin):
        return module if module is not None else importlib.import_module(_NAME)
    standin = module
    del sys.modules[_NAME]  # its ``from . import config`` finds the config module already loaded
    try:
        module = importlib.import_module(_NAME)
    except BaseException:
        sys.modules[_NAME] = standin
        raise
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    return module


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    """Runs the real package's ``__init__`` before any of its submodules loads, as Python does for
    a real package (``from torch._dynamo.source import ...`` in torch's fake-tensor code loads
    ``torch._dynamo`` first; loading ``source`` under the stand-in would start dynamo's circular
    imports in the wrong order)."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(f"{_NAME}.") or not installed():
            return None
        _real()
        module = sys.modules.pop(fullname, None)
        if module is None:
            return None  # the package does not import it: the path finder loads it as usual
        # the import under way must not load it a second time: hand it the module the package loaded
        return importlib.util.spec_from_loader(fullname, _Loaded(module))


class _Loaded(importlib.abc.Loader):
    """A loader for a module that is already loaded (it keeps its own ``__spec__``)."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        module.__spec__ = self.spec


_FINDER = _SubmoduleFinder()


class _Standin(types.ModuleType):
    """``torch._dynamo`` until something needs more than its config and ``disable``: any other
    attribute loads the real package, and so does importing any submodule but ``config``
    (``_SubmoduleFinder``). Dunder lookups (``inspect.getmodule`` asks every module for
    ``__file__``) do not."""

    def __init__(self, config: types.ModuleType) -> None:
        super().__init__(_NAME, "stands in for torch._dynamo until it is used (archscan.capture.nocompile)")
        self.config = config
        self.__path__ = [os.path.dirname(config.__file__)]

    def disable(self, fn=None, recursive: bool = True, **kwargs):
        if fn is None:
            return _real().disable(fn, recursive, **kwargs)
        return _Deferred(fn, recursive, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(_real(), name)


class _Deferred:
    """``torch._dynamo.disable(fn)`` that calls ``fn`` itself while dynamo cannot be running (the
    package and its frame evaluator are not loaded: nothing is being compiled, so there is nothing
    to disable), and the real ``disable(fn)`` from then on."""

    __slots__ = ("fn", "recursive", "kwargs", "real")

    def __init__(self, fn, recursive: bool, kwargs: dict) -> None:
        self.fn, self.recursive, self.kwargs, self.real = fn, recursive, kwargs, None

    def __call__(self, *args, **kwargs):
        if self.real is None:
            if _EVAL_FRAME not in sys.modules and isinstance(sys.modules.get(_NAME), _Standin):
                return self.fn(*args, **kwargs)
            self.real = _real().disable(self.fn, self.recursive, **self.kwargs)
        return self.real(*args, **kwargs)
