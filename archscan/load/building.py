"""Building the model to analyse: on the meta device wrapped as fake CPU tensors (no memory,
no compute), or for real when a constructor needs values or a measurement needs weights."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx
import torch.fx._pytree as fx_pytree
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.nn.modules.lazy import LazyModuleMixin
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..costs import packed_attributes
from ..errors import ArchscanError, CaptureError
from .frames import at, short
from .specs import path_text
from .targets import InputSpec, ModelTarget, input_leaves
from .recording import quiet


def _inside(convert: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``convert`` applied to the inner tensors of a tensor subclass (torchao's quantized weights:
    ``__tensor_flatten__``), the subclass rebuilt around them: a meta or fake copy of a quantized
    weight stays quantized, its stored bytes the same; a plain tensor as ``convert`` makes it."""
    def apply(t: torch.Tensor) -> torch.Tensor:
        if not is_traceable_wrapper_subclass(t):
            return convert(t)
        names, ctx = t.__tensor_flatten__()
        return type(t).__tensor_unflatten__({n: apply(getattr(t, n)) for n in names}, ctx, t.size(), t.stride())
    return apply


def _copy_with(model: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor], shallow: bool = False) -> nn.Module:
    """A copy of a user's module whose parameters and buffers (and the tensors autograd derived
    from them) are ``convert(t)`` (a tensor subclass's inner tensors: ``_inside``); the original is
    left untouched. ``shallow``: for a module archscan built itself, the copy shares the attributes
    that are neither tensors, modules nor containers (``module_copy``); a user's instance is copied
    whole, so nothing a scan runs can change an object it holds."""
    convert = _inside(convert)
    memo: dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in memo:
            new = convert(t.detach())
            memo[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
    return copy_holding(model, memo, lambda t: convert(t.detach()), shallow)


def copy_holding(model: nn.Module, memo: dict, convert: Callable[[torch.Tensor], torch.Tensor],
                 shallow: bool = True) -> nn.Module:
    """A copy of ``model`` holding ``memo``'s tensors (id of each parameter and buffer -> its
    replacement): ``module_copy`` where ``shallow`` and the tree is plain, else ``copy.deepcopy``,
    the tensors autograd derived from the weights made by ``convert``."""
    quick = module_copy(model, memo) if shallow else None
    if quick is not None:
        return quick
    with warnings.catch_warnings():  # an exported program's tree specs warn about their own deprecations
        warnings.simplefilter("ignore", FutureWarning)
        return copy.deepcopy(model, derived_tensors(model, memo, convert))


class _NotPlain(Exception):
    pass


def module_copy(model: nn.Module, tensors: dict) -> nn.Module | None:
    """``copy.deepcopy(model, tensors)`` for a plain module tree, several times faster: new modules
    with new parameter, buffer, submodule and hook tables, new lists, dicts and sets of plain
    values, every other attribute shared (numbers, strings, functions: nothing a forward or a cut
    changes in place). None when an attribute holds a module, a tensor or a method bound to a
    module outside those tables, or a container nested in a container: deepcopy then copies what
    it must."""
    done: dict[int, nn.Module] = {}

    def copy_of(m: nn.Module) -> nn.Module:
        if id(m) in done:
            return done[id(m)]
        new = object.__new__(type(m))
        done[id(m)] = new
        state = {}
        for key, value in vars(m).items():
            if type(value) in _SHARED:
                pass
            elif key == "_modules":
                value = {k: copy_of(c) if c is not None else None for k, c in value.items()}
            elif key in ("_parameters", "_buffers"):
                value = {k: tensors[id(t)] if t is not None else None for k, t in value.items()}
            elif isinstance(value, (list, dict, set)):
                if value and not all(map(_plain, value.values() if isinstance(value, dict) else value)):
                    raise _NotPlain(key)  # (a hook table holding a module's own method, a list of modules)
                value = value.copy()
            elif not _plain(value):
                raise _NotPlain(key)
            state[key] = value
        new.__dict__.update(state)
        return new

    try:
        return copy_of(model)
    except (_NotPlain, KeyError):
        return None


_SHARED = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device})


def _plain(value) -> bool:
    """A value a copy may share: anything but a module, a tensor, a method bound to a module or a
    list, dict or set (a tuple of plain values is plain)."""
    if type(value) is tuple:
        return all(_plain(v) for v in value)
    if isinstance(value, (nn.Module, torch.Tensor, list, dict, set)):
        return False
    return not (callable(value) and isinstance(getattr(value, "__self__", None), nn.Module))


def _fake_copy(model: nn.Module, fake_mode: FakeTensorMode) -> nn.Module:
    """A copy of a user's module whose tensors are fake; the original is left untouched."""
    return _copy_with(model, fake_mode.from_tensor)


def meta_instance(model: nn.Module, shallow: bool = False) -> nn.Module:
    """A copy of a user's module with its weights on the meta device, sizes, strides and dtypes
    kept (for a direct run); the original is left untouched (``shallow``: as ``_copy_with``)."""
    return _copy_with(model, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"),
                      shallow)


def derived_tensors(model: nn.Module, memo: dict, convert: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    """Add to a deepcopy memo the tensors modules keep as plain attributes that autograd computed
    (``nn.utils.weight_norm`` stores ``weight`` so): deepcopy refuses non-leaf tensors, and the
    hook that computed them recomputes them in the copy's next forward."""
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and not value.is_leaf and id(value) not in memo:
                memo[id(value)] = convert(value)
    return memo


def _replace_tensors(model: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor],
                     as_param: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     skip: Callable[[torch.Tensor], bool] = lambda t: False) -> nn.Module:
    """Replace every parameter and buffer ``t`` with ``convert(t)`` in place, each distinct tensor
    once so shared ones stay shared; parameters are re-wrapped by ``as_param(new, old)``."""
    memo: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for store, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(store.items()):
                if t is None or skip(t):
                    continue
                if id(t) not in memo:
                    new = convert(t)
                    memo[id(t)] = as_param(new, t) if is_param else new
                store[name] = memo[id(t)]
    return model


def _meta_to_fake(model: nn.Module, fake_mode: FakeTensorMode) -> nn.Module:
    """Wrap a meta-device model's tensors as fake CPU tensors."""
    cpu = torch.device("cpu")

    def fake(t: torch.Tensor) -> torch.Tensor:
        if not t.is_meta:
            raise ValueError("a tensor of the model is not on the meta device")
        return FakeTensor(fake_mode, t.detach(), cpu)

    return _replace_tensors(model, _inside(fake), lambda new, old: _as_parameter(new, old.requires_grad))


def _as_parameter(t: torch.Tensor, requires_grad: bool = False) -> torch.Tensor:
    """Mark a fake tensor as a parameter (requiring grad as the parameter it replaces did).

    ``nn.Parameter(subclass_tensor)`` returns the subclass instance flagged ``_is_param``
    (that is how ``isinstance(x, nn.Parameter)`` works for tensor subclasses); setting the flag
    directly skips a dispatched ``detach`` and is 15x faster, which matters on small networks.
    """
    t._is_param = True
    if isinstance(t, nn.Parameter):
        return t.requires_grad_(requires_grad) if t.requires_grad != requires_grad else t
    return nn.Parameter(t, requires_grad=requires_grad)


def _same_kind_of_param(new: torch.Tensor, old: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(new, requires_grad=old.requires_grad)


def _fakeify(model: nn.Module, fake_mode: FakeTensorMode) -> nn.Module:
    """Replace a real model's parameters and buffers with fake tensors."""
    return _replace_tensors(model, lambda t: fake_mode.from_tensor(t.detach()), _same_kind_of_param)


_INIT_METHODS = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.fill_, torch.Tensor.zero_,
                 torch.Tensor.random_, torch.Tensor.exponential_, torch.Tensor.bernoulli_, torch.Tensor.copy_,
                 torch.Tensor.clamp_, torch.Tensor.erfinv_, torch.Tensor.mul_, torch.Tensor.add_, torch.Tensor.div_}


def _is_initialiser(func) -> bool:
    return getattr(func, "__module__", None) == "torch.nn.init" and getattr(func, "__name__", "").endswith("_")


class _SkipInit(TorchFunctionMode):
    """Turns in-place writes into no-ops while a model is built on the meta device.

    Meta tensors hold no values, so initialisers (``normal_``, ``uniform_``, ``fill_``...) have
    nothing to do; on meta they still run shape-checking Python reference code, which costs more
    than the rest of building a small network (and imports sympy). ``torch.nn.init``'s in-place
    initialisers come here as themselves: what they call inside would not.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        tensor = args[0] if args else (kwargs or {}).get("tensor")  # torch.nn.init passes it by name
        if (func in _INIT_METHODS or _is_initialiser(func)) and isinstance(tensor, torch.Tensor) and tensor.is_meta:
            return tensor
        return func(*args, **(kwargs or {}))


def build_fake(target: ModelTarget, kwargs: dict, dtype: torch.dtype | None, fake_mode: FakeTensorMode,
               specs: Sequence[InputSpec] = (), meta: nn.Module | None = None) -> nn.Module:
    """Construct the model without allocating weights (fake tensors); ``specs`` give lazy modules
    (``nn.LazyLinear``...) the first forward that decides their weights' shapes. ``meta``: the
    model already built by ``build_meta``, wrapped instead of building another."""
    if meta is None and target.built is not None:
        meta = meta_instance(target.built, shallow=True)  # wrapped in place: a copy, the build stays as it was
    if meta is not None:
        return _prepare(_meta_to_fake(meta, fake_mode), dtype, fake_mode)
    if target.instance is not None:
        if has_lazy(target.instance):
            return _prepare(_fakeify(build_real(target, kwargs, None, specs), fake_mode), dtype, fake_mode)
        return _prepare(_fake_copy(target.instance, fake_mode), dtype, fake_mode)
    try:
        # Built on the meta device (initialisers are no-ops there), then each tensor is wrapped
        # as a fake CPU tensor so kernels are chosen as on a CPU (fused attention paths).
        return _prepare(_meta_to_fake(build_meta(target, kwargs, specs), fake_mode), dtype, fake_mode)
    except ArchscanError:
        raise
    except Exception:
        pass
    try:
        with fake_mode, quiet():
            model = target.build(kwargs)
        _check_packed(model)
        return _prepare(model, dtype, fake_mode)
    except ArchscanError:
        raise
    except Exception:
        pass  # the constructor needs real values (e.g. .tolist() on a tensor): build for real
    model = build_real(target, kwargs, None, specs)
    return _prepare(_fakeify(model, fake_mode), dtype, fake_mode)


def with_build(target: ModelTarget, kwargs: dict, specs: Sequence[InputSpec] = ()) -> ModelTarget:
    """The target with its model built once on the meta device (``ModelTarget.built``), for a scan
    whose stages (the capture, the inference memory, the training step, the budget's searches, the
    decode phases) each need a copy: the user's constructor runs once. A constructor that fails
    on the meta device (it needs values) keeps the target as it is: each stage builds it as before."""
    if target.factory is None or target.instance is not None or target.built is not None:
        return target
    try:
        return dataclasses.replace(target, built=build_meta(target, kwargs, specs))
    except Exception:
        return target


def build_meta(target: ModelTarget, kwargs: dict, specs: Sequence[InputSpec] = ()) -> nn.Module:
    """Construct the model on the meta device, initialisers skipped (no memory, no values); a
    copy of ``target.built`` where the scan built it already."""
    if target.built is not None:
        return meta_instance(target.built, shallow=True)
    with torch.device("meta"), _SkipInit(), quiet():
        model = target.build(kwargs)
        _materialize_lazy(model, specs, torch.device("meta"))
    _check_packed(model)
    return model


def _check_packed(model: nn.Module) -> None:
    """Refuse a build without values (meta, fake) that holds torch.ao's packed weights: packing
    (``quantize_dynamic``, ``convert``) runs fbgemm on the values, and what it packs from fake or
    meta tensors is no weight (its quantization parameters cannot be read). The model is then
    built for real; the copies made from a real build keep the real packed weights."""
    if any(packed_attributes(m) for m in model.modules()):
        raise ValueError("torch.ao's packed weights need a build with values")


def on_meta(model: nn.Module) -> bool:
    """Every parameter and buffer of ``model`` is on the meta device (``build_meta`` made it, or a
    copy of such a model): a direct run can capture it."""
    return all(t.is_meta for t in [*model.parameters(), *model.buffers()])


def build_real(target: ModelTarget, kwargs: dict, dtype: torch.dtype | None,
               specs: Sequence[InputSpec] = ()) -> nn.Module:
    """Construct the model with real weights on the CPU (lazy modules materialised by one forward)."""
    try:
        model = (copy.deepcopy(target.instance, derived_tensors(target.instance, {}, lambda t: t.detach().clone()))
                 if target.instance is not None else target.build(kwargs))
    except ArchscanError:
        raise
    except Exception as exc:
        raise CaptureError(
            f"building {target.name} failed{at(exc, target.source_file)}: {type(exc).__name__}: {exc}"
        ) from exc
    model.eval()
    _materialize_lazy(model, specs, torch.device("cpu"))
    if dtype is not None:
        model.to(dtype)
    return model


def has_lazy(model: nn.Module) -> bool:
    return any(isinstance(m, LazyModuleMixin) and m.has_uninitialized_params() for m in model.modules())


def _materialize_lazy(model: nn.Module, specs: Sequence[InputSpec], device: torch.device) -> None:
    """Lazy modules learn their weights' shapes in their first forward: run one (on meta tensors
    when building without weights)."""
    if not has_lazy(model):
        return
    lazy = [name or type(m).__name__ for name, m in model.named_modules()
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()]
    if not specs:
        raise CaptureError(f"lazy modules ({', '.join(lazy[:3])}) need a first forward to shape their weights",
                           hint="pass --input so archscan can run it")
    call = make_call(specs, None, device=device)
    try:
        with torch.no_grad(), quiet():
            call(model)
    except Exception as exc:
        raise CaptureError(f"lazy modules ({', '.join(lazy[:3])}) need a first forward to shape their weights, "
                           f"and it failed{at(exc)}: {short(exc)}") from exc


def _prepare(model: nn.Module, dtype: torch.dtype | None, fake_mode: FakeTensorMode) -> nn.Module:
    model.eval()
    if dtype is not None:
        with fake_mode:
            _cast(model, dtype)
    return model


def _cast(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating-point parameters and buffers in place, keeping shared tensors shared.

    (``Module.to`` swaps tensors, which fake parameters of a copied module do not allow.)
    """
    _replace_tensors(model, lambda t: t.detach().to(dtype), _same_kind_of_param,  # a quantized weight keeps its type
                     skip=lambda t: not t.is_floating_point() or is_traceable_wrapper_subclass(t))


@dataclass(frozen=True)
class Call:
    """Example inputs as forward takes them: positional ``args``, then ``kwargs`` by name."""

    args: tuple
    kwargs: dict

    @classmethod
    def of(cls, specs: Sequence[InputSpec], tensors: Sequence[torch.Tensor]) -> "Call":
        """The tensors placed as the specs say: in order, by name, and inside a nested argument
        (a list, tuple, dict or dataclass built around them: ``InputSpec.path``)."""
        args: list = []
        kwargs: dict = {}
        trees: dict = {}  # a nested argument -> its tree (_Tree)
        for s, t in zip(specs, tensors):
            if not s.path:
                if s.name:
                    kwargs[s.name] = t
                else:
                    args.append(t)
                continue
            key = ("name", s.name) if s.name else ("arg", s.arg)
            if key not in trees:
                trees[key] = _Tree(s.path[0][0])
                if s.name:
                    kwargs[s.name] = trees[key]
                else:
                    args.append(trees[key])
            node = trees[key]
            for (_, step), (kind, _) in zip(s.path, s.path[1:]):
                node = node.items.setdefault(step, _Tree(kind))
            node.items[s.path[-1][1]] = t
        return cls(tuple(_built(a) for a in args), {k: _built(v) for k, v in kwargs.items()})

    def __call__(self, fn: Callable) -> Any:
        return fn(*self.args, **self.kwargs)

    def tensors(self) -> list[torch.Tensor]:
        """Every input tensor, nested ones included, in order."""
        return [t for x in (*self.args, *self.kwargs.values()) for _, t in nested_tensors(x)]

    def graph_args(self, gm: torch.fx.GraphModule) -> list:
        """Values for a traced graph's placeholders, in their order: an exported graph flattens
        (args, kwargs) by its input spec; an fx graph has one placeholder per forward argument."""
        spec = getattr(gm, "_in_spec", None)
        if spec is not None:
            return fx_pytree.tree_flatten_spec((self.args, self.kwargs), spec)
        values = []
        for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
            if i < len(self.args):
                values.append(self.args[i])
            elif node.target in self.kwargs:
                values.append(self.kwargs[node.target])
            elif node.args:
                values.append(node.args[0])  # the argument's default
            else:
                break
        return values


def nested_tensors(x: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors in an input (itself, or those in a list, tuple, dict or dataclass of them,
    nested), each with its place in it: ('', x), ('[0]', ...), ('.time_ids', ...)."""
    return [(path_text(path), t) for path, t in input_leaves(x) if isinstance(t, torch.Tensor)]


class _Tree:
    """A nested argument being built (``Call.of``): its kind ("list", "tuple", "dict" or a dataclass)
    and its items by index, key or field."""

    __slots__ = ("kind", "items")

    def __init__(self, kind):
        self.kind, self.items = kind, {}


def _built(x: Any) -> Any:
    """A nested argument's tree (``Call.of``) as the container it stands for."""
    if not isinstance(x, _Tree):
        return x
    kind, items = x.kind, {k: _built(v) for k, v in x.items.items()}
    if kind == "dict":
        return items
    if kind in ("list", "tuple"):
        values = [items[i] for i in sorted(items)]
        return values if kind == "list" else tuple(values)
    return kind(**items)  # a dataclass: its fields (those left out keep their defaults)


def make_call(specs: Sequence[InputSpec], model_dtype: torch.dtype | None, fake_mode=None,
              device: torch.device | None = None) -> Call:
    """``make_inputs``, arranged as forward takes them."""
    return Call.of(specs, make_inputs(specs, model_dtype, fake_mode, device))


def make_inputs(specs: Sequence[InputSpec], model_dtype: torch.dtype | None, fake_mode=None,
                device: torch.device | None = None) -> list[torch.Tensor]:
    """Random float inputs, in the model's dtype; integer inputs zeros (valid token ids) or drawn
    from the spec's ``values`` (seeded: the same every run); a spec's example tensor as it is."""
    out = []
    for i, s in enumerate(specs):
        dt = model_dtype if (model_dtype is not None and s.dtype == torch.float32) else s.dtype
        if s.example is not None:
            x = s.example.to(device=device, dtype=dt)
        elif s.values is not None:
            x = torch.randint(s.values[0], s.values[1] + 1, s.shape, dtype=s.dtype,
                              generator=torch.Generator().manual_seed(i)).to(device)
        else:
            x = None
        if x is not None:
            out.append(fake_mode.from_tensor(x) if fake_mode is not None else x)
            continue
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            if s.dtype.is_floating_point:
                out.append(torch.randn(s.shape, dtype=dt, device=device))
            else:
                out.append(torch.zeros(s.shape, dtype=s.dtype, device=device))
    return out


_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_forward_hooks_always_called",
                 "_global_forward_hooks_with_kwargs", "_global_backward_hooks", "_global_backward_pre_hooks")


@contextlib.contextmanager
def global_hooks_set_aside():
    """The global module hooks the user registered (``register_module_forward_hook``...) set aside
    while archscan runs a model (they would see fake tensors or fill the user's lists), and given
    back after."""
    hooks = nn.modules.module
    saved = {name: getattr(hooks, name).copy() for name in _GLOBAL_HOOKS if hasattr(hooks, name)}
    for name in saved:
        getattr(hooks, name).clear()
    try:
        yield
    finally:
        for name, value in saved.items():
            getattr(hooks, name).update(value)


def _hook_function(hook):
    while isinstance(hook, functools.partial):
        hook = hook.func
    return hook


def _package(name: str | None) -> str:
    return (name or "").partition(".")[0]


def _kept_hook(hook, owners: set[str]) -> bool:
    """Hooks that compute what forward uses are part of the model:

    * torch's own hook objects (``weight_norm``, ``spectral_norm``, ``torch.nn.utils.prune``) and
      torch.distributed's (FSDP2's all-gathers, tensor parallel's input and output layouts);
    * hooks a library installs on its own models: defined in an installed package (``owners``)
      that the hooked module's class or one of its parents' comes from (transformers 5 collects
      the hidden states a vision-language model's projector reads with forward hooks on its
      layers; timm's feature extraction hooks torch.nn layers of its models).

    A hook from the user's own code (a script, a model file, a package not installed under
    site-packages) or from a package other than the module's is the user's: it is set aside."""
    hook = _hook_function(hook)
    owner = hook.__self__ if hasattr(hook, "__self__") else hook
    defined = getattr(hook, "__module__", None) if owner is hook else type(owner).__module__
    if (defined or "").startswith("torch.distributed") or \
            (type(owner).__module__ or "").startswith(("torch.nn.utils", "torch.distributed")):
        return True
    package = _package(defined)
    return package in owners and package not in ("torch", "archscan") and _installed(package)


def _installed(package: str) -> bool:
    """Is ``package`` an installed library (under site-packages), not the user's own code (a
    script, a model file, a package of theirs on the path)?"""
    path = getattr(sys.modules.get(package), "__file__", None) or ""
    return any(f"{os.sep}{d}{os.sep}" in os.path.abspath(path) for d in ("site-packages", "dist-packages"))


def _hook_name(hook) -> str:
    hook = _hook_function(hook)
    return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or type(hook).__name__


def strip_user_hooks(model: nn.Module) -> list[str]:
    """Remove the forward hooks the user put on a model's modules, keeping those that are part of
    the model (``_kept_hook``); returns where they were and what they were, as 'path (hook)'. A
    hook that collects features or calls ``.numpy()`` would see fx proxies or fake tensors, fail,
    or fill the user's lists with them: the analysis is of forward itself."""
    removed = []
    owners: dict[str, set[str]] = {}  # path -> the packages of its module's class and its parents'
    for path, module in model.named_modules():
        parent = owners.get(path.rpartition(".")[0], set()) if path else set()
        owners[path] = parent | {_package(type(module).__module__)}
        for store in ("_forward_hooks", "_forward_pre_hooks"):
            hooks = getattr(module, store, None)
            for key, hook in list((hooks or {}).items()):
                if _kept_hook(hook, owners[path]):
                    continue
                del hooks[key]
                removed.append(f"{path or type(model).__name__} ({_hook_name(hook)})")
    return removed
