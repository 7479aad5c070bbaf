"""Resolve what the user names into a model factory and input specs.

Targets:
    "path/to/model.py:Net"      a class or factory function in a Python file
    "pkg.module:factory"        an importable callable (class or function)
    "zoo:shufflenet_v2_x1_0"    a model of archscan's zoo

Input specs: comma-separated shape with an optional dtype, "1,3,224,224" or "1,128:int64".
Constructor arguments: "width_mult=0.5,num_classes=10" (values are Python literals; a bare
word such as ``act=relu`` is a string only where the constructor takes a string).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import os
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from ..errors import ArchscanError, CaptureError
from .frames import at, exit_error, short
from .specs import check_target, dtype_key, path_text, split_argument, split_input_spec, split_values



@dataclass(frozen=True)
class InputSpec:
    """The shape and dtype of one example input; ``name`` passes it to forward by keyword."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    name: str | None = None
    values: tuple[int, int] | None = None   # integer inputs: drawn uniformly from LOW..HIGH (seeded); else zeros
    example: torch.Tensor | None = field(default=None, compare=False, repr=False)  # a tensor whose values are used
    # a tensor inside a nested argument (a list of images, a dict of conditions, a dataclass): its
    # place in the argument, step by step: ("list" | "tuple", index), ("dict", key), (a dataclass, field)
    path: tuple = ()
    arg: int | None = None  # a nested positional argument's position among the inputs (its tensors share it)

    @property
    def label(self) -> str | None:
        """The argument and the place in it: 'images[0]', 'added_cond_kwargs.time_ids', '[1].mask'
        for a positional one; the name alone for a flat input (None when positional)."""
        if not self.path:
            return self.name
        return (self.name or "") + path_text(self.path)

    def to_json(self) -> dict:
        out = {"shape": list(self.shape), "dtype": dtype_name(self.dtype)}
        if self.example is not None:
            out["values"] = "the example tensor's"
        elif self.values is not None:
            out["values"] = list(self.values)
        elif not self.dtype.is_floating_point and self.dtype != torch.bool:
            out["values"] = "zeros"
        if self.path:
            out["path"] = path_text(self.path)
            if self.name is None:
                out["arg"] = self.arg
        return {**out, "name": self.label} if self.name else out


@dataclass(frozen=True)
class ModelTarget:
    """A resolved model: how to build it and what to call it."""

    name: str
    factory: Callable[..., nn.Module] | None
    instance: nn.Module | None = None
    source_file: str | None = None
    default_inputs: tuple[str, ...] = ()
    program: bool = False  # ``instance`` is an exported program's module: its graph is the capture
    # the factory's model, built once for a scan on the meta device (``building.with_build``):
    # every fake or meta copy a stage needs is made from it, and the constructor does not run again
    built: nn.Module | None = None

    def build(self, kwargs: dict[str, Any]) -> nn.Module:
        """Call the factory (or return the instance); errors become ArchscanError."""
        if self.instance is not None:
            if kwargs:
                raise ArchscanError(f"{self.name} is a module instance; --kwargs cannot be applied to it")
            return self.instance
        _check_call(self.factory, kwargs, self.name)
        model = self.factory(**{k: str(v) if isinstance(v, BareWord) else v for k, v in kwargs.items()})
        if not isinstance(model, nn.Module):
            raise ArchscanError(
                f"{self.name}(...) returned {type(model).__name__}, not a torch.nn.Module",
                hint="point archscan at a module class or a function returning one",
            )
        return model


def output_path(name: str, kind: str = "fused") -> str:
    """Where a transform saves by default: ('zoo:resnet50', 'fused') -> 'resnet50-fused.pt2';
    ('models/net.py:Net', 'pruned') -> 'Net-pruned.pt2'."""
    stem = name.rpartition(":")[2] or name
    stem = os.path.splitext(os.path.basename(stem))[0] or "model"
    return f"{stem}-{kind}.pt2"


def dtype_name(dtype: torch.dtype) -> str:
    """'torch.float32' -> 'float32'."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(text: str) -> torch.dtype:
    """A dtype by name ('bfloat16', 'bf16', 'int64', ...) that an example input can have."""
    return getattr(torch, dtype_key(text, lambda key: isinstance(getattr(torch, key, None), torch.dtype)))


def parse_input_spec(text: str) -> InputSpec:
    """'1,3,224,224' -> InputSpec((1, 3, 224, 224), float32); '1,128:int64' for token ids;
    'decoder_input_ids=1,16:int64' passes the input to forward by keyword (``archscan.load.specs``)."""
    shape, dtype, name = split_input_spec(text)
    name, path = split_argument(name) if name else (None, ())
    return InputSpec(shape, parse_dtype(dtype), name, split_values(text.strip())[1], path=path)


def _load_program(path: str, allow_pickle: bool = False) -> ModelTarget:
    """An exported program (``torch.export.save``): its module, and its example inputs as defaults.

    ``torch.export.load`` unpickles parts of an archive without restriction (sample inputs and
    constants fall back to it, weights marked ``use_pickle`` use it, custom and opaque objects are
    pickles, AOTInductor members are native code). Unless ``allow_pickle``, every torch-saved member
    is first read with torch's weights-only unpickler, members that can only be loaded by running
    code are refused by name, and the load itself runs with weights-only ``torch.load`` forced:
    no code in the file runs. The archive is read once, so what was checked is what is loaded."""
    from .recording import quiet  # torch logs a traceback of its own before raising

    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ArchscanError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not allow_pickle:
        _check_archive(path, data)
    try:
        with quiet(), _weights_only_loads(not allow_pickle):
            program = torch.export.load(io.BytesIO(data))
        specs = _example_specs(program.example_inputs)
        if not specs and program.example_inputs is not None:
            program.example_inputs = None  # unusable ones: module() would trip on them
        module = program.module()
    except Exception as exc:
        if not allow_pickle and _is_unpickling_refusal(exc):
            raise _unsafe(path, "a pickled member") from None
        raise ArchscanError(f"{path} is not an exported program torch.export.load can read: "
                            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                            hint="write it with torch.export.save(torch.export.export(model, args), path)") from None
    return ModelTarget(path, None, instance=module, source_file=os.path.abspath(path), default_inputs=specs, program=True)


def _example_specs(example: Any) -> tuple[str, ...]:
    """A program's example inputs as ``--input`` specs; none when they are not ``(args, kwargs)``
    of tensors (the archive's own; ``--input`` then says what to run)."""
    if not (isinstance(example, tuple) and len(example) == 2 and isinstance(example[0], (tuple, list))
            and isinstance(example[1], dict)):
        return ()
    args, kwargs = example
    if not all(isinstance(t, torch.Tensor) for t in (*args, *kwargs.values())):
        return ()
    specs = [f"{','.join(map(str, t.shape))}:{dtype_name(t.dtype)}" for t in args]
    specs += [f"{name}={','.join(map(str, t.shape))}:{dtype_name(t.dtype)}" for name, t in kwargs.items()]
    return tuple(specs)


# members torch.export.load reads with pickle.loads, TorchScript's unpickler or as a shared library
_CODE_MEMBERS = ("custom_obj_", "opaque_obj_")
_NATIVE_DIR = "data/aotinductor/"


def _check_archive(path: str, data: bytes) -> None:
    """Refuse an archive with a member that needs more than the weights-only unpickler: every
    member that is a torch-saved file (a zip holding ``data.pkl``) is read with
    ``torch.load(weights_only=True)``; object and native-code members are refused by name."""
    import zipfile

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        return  # not an archive: torch.export.load says so
    with archive:
        for info in archive.infolist():
            name = info.filename
            inner = name.split("/", 1)[1] if "/" in name else name
            if inner.startswith(_NATIVE_DIR) or os.path.basename(name).startswith(_CODE_MEMBERS):
                raise _unsafe(path, name)
            with archive.open(info) as fh:
                head = fh.read(4)
            if head != b"PK\x03\x04":
                continue
            member = archive.read(info)
            try:
                with zipfile.ZipFile(io.BytesIO(member)) as saved:
                    if not any(n.endswith("data.pkl") for n in saved.namelist()):
                        continue
            except zipfile.BadZipFile:
                continue  # raw tensor bytes that happen to start so
            try:
                torch.load(io.BytesIO(member), map_location="cpu", weights_only=True)
            except Exception:
                raise _unsafe(path, name) from None


def _unsafe(path: str, member: str) -> ArchscanError:
    return ArchscanError(f"{path}: {member} can only be loaded by running code stored in the file; refused",
                         hint="--allow-pickle loads it anyway: only for a file from someone you trust")


def _is_unpickling_refusal(exc: BaseException | None) -> bool:
    import pickle

    while exc is not None:
        if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextlib.contextmanager
def _weights_only_loads(force: bool):
    """Every ``torch.load`` inside, weights-only whatever its caller passes
    (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``, read by torch at each call)."""
    if not force:
        yield
        return
    saved = {k: os.environ.pop(k, None) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets or quotes."""
    out, depth, quote, cur = [], 0, None, []
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


class BareWord(str):
    """A --kwargs value that is not a Python literal (``act=relu``): a string only where the
    constructor's signature says it takes one (see ``_check_call``)."""


def parse_kwargs(text: str | None) -> dict[str, Any]:
    """'width_mult=0.5,num_classes=10,act=relu' -> {'width_mult': 0.5, 'num_classes': 10, 'act': BareWord('relu')}."""
    if not text:
        return {}
    result: dict[str, Any] = {}
    for item in _split_top_level(text):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key.isidentifier():
            raise ArchscanError(
                f"malformed --kwargs item {item!r}", hint="write name=value pairs: --kwargs width_mult=0.5,num_classes=10"
            )
        if key in result:
            raise ArchscanError(f"--kwargs gives {key!r} twice", hint="give each constructor argument once")
        try:
            result[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            if not value.replace("-", "_").replace(".", "_").isidentifier():
                raise ArchscanError(f"--kwargs {key}={value} is not a Python literal",
                                    hint=f"write numbers, True/False/None, lists or quoted strings: {key}='...'") from None
            result[key] = BareWord(value)
    return result


def _takes_string(param: inspect.Parameter) -> bool:
    """Does a constructor parameter take a string (its default is one, or its annotation names ``str``)?"""
    annotation = param.annotation
    text = annotation if isinstance(annotation, str) else repr(annotation)  # "<class 'str'>", "str | None"
    return isinstance(param.default, str) or re.search(r"\bstr\b", text) is not None


def _check_call(factory: Callable[..., Any], kwargs: dict[str, Any], name: str) -> None:
    """Fail early, with a clear message, when the constructor arguments do not fit."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    for key, value in kwargs.items():
        param = sig.parameters.get(key)
        if isinstance(value, BareWord) and param is not None and not _takes_string(param):
            raise ArchscanError(f"--kwargs {key}={value} is not a Python literal and {name}'s {key} does not take a string",
                                hint=f"write a number, True/False/None or a list; quote a string: {key}='{value}'")
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        required = [
            p.name for p in sig.parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in kwargs
        ]
        if required:
            example = ",".join(f"{r}=..." for r in required)
            raise ArchscanError(
                f"{name} needs constructor arguments that were not given: {', '.join(required)}",
                hint=f"pass them with --kwargs {example}",
            ) from exc
        raise ArchscanError(f"{name}: {exc}", hint="check --kwargs against the constructor's signature") from exc


def _candidates(namespace: dict[str, Any]) -> list[str]:
    names = []
    for key, value in namespace.items():
        if key.startswith("_"):
            continue
        if isinstance(value, type) and issubclass(value, nn.Module) and value.__module__ == namespace.get("__name__"):
            names.append(key)
        elif isinstance(value, nn.Module):
            names.append(key)
    return sorted(names)


def _load_file(path: str) -> Any:
    """Import a Python file as a module, the way ``python path`` would see it (its own directory on
    ``sys.path``, ``sys.argv == [path]``); source encodings are read as import reads them."""
    abspath = os.path.abspath(path)
    try:
        with open(abspath, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        raise ArchscanError(f"cannot read model file {path}: {exc.strerror or exc}",
                            hint="check the file's permissions") from exc
    try:
        code = compile(source, abspath, "exec", dont_inherit=True)  # bytes: BOM and coding cookies honoured
    except SyntaxError as exc:
        if b"\0" in source or "null bytes" in str(exc.msg) or "decode" in str(exc.msg):
            raise CaptureError(f"{path} is not Python source ({exc.msg})",
                               hint="point archscan at the .py file that defines the model") from exc
        raise CaptureError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except ValueError as exc:  # null bytes on older Pythons
        raise CaptureError(f"{path} is not Python source ({exc})",
                           hint="point archscan at the .py file that defines the model") from exc
    stem = os.path.splitext(os.path.basename(abspath))[0]
    mod_name = "_archscan_user_" + "".join(c if c.isalnum() else "_" for c in stem)
    directory = os.path.dirname(abspath)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module = types.ModuleType(mod_name)
    module.__file__ = abspath
    sys.modules[mod_name] = module
    argv, sys.argv = sys.argv, [abspath]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            exec(code, module.__dict__)
    except Exception as exc:  # the user's module failed at import time
        sys.modules.pop(mod_name, None)
        raise CaptureError(f"importing {path} failed{at(exc, abspath)}: {short(exc)}") from exc
    except SystemExit as exc:
        sys.modules.pop(mod_name, None)
        raise exit_error(exc, f"importing {path}", abspath, stderr.getvalue()) from None
    finally:
        sys.argv = argv
    sys.stderr.write(stderr.getvalue())  # what the module said while importing, once it is known to import
    return module


def _import_module(name: str) -> Any:
    """``importlib.import_module``, with the module's own failures reported as the model's."""
    argv, sys.argv = sys.argv, [name]
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if exc.name is not None and name.startswith(exc.name):  # the module itself is not there
            raise ArchscanError(f"cannot import {name!r}: {exc}", hint="is the package installed or on PYTHONPATH?") from exc
        raise CaptureError(f"importing {name} failed{at(exc)}: {short(exc)}") from exc
    except Exception as exc:
        raise CaptureError(f"importing {name} failed{at(exc)}: {short(exc)}") from exc
    except SystemExit as exc:
        raise exit_error(exc, f"importing {name}") from None
    finally:
        sys.argv = argv


def resolve_target(target: str, allow_pickle: bool = False) -> ModelTarget:
    """Turn 'file.py:Net', 'pkg.mod:factory', 'zoo:name' or 'program.pt2' into a ModelTarget
    (``allow_pickle``: see ``_load_program``)."""
    check_target(target)
    if target.endswith(".pt2") and ":" not in target:
        return _load_program(target, allow_pickle)
    if target.startswith("zoo:"):
        from .. import zoo

        entry = zoo.get_entry(target[4:])
        return ModelTarget(target, entry.factory, default_inputs=entry.default_input)
    where, _, attr = target.rpartition(":")
    if where.endswith(".py") or os.sep in where or os.path.exists(where):
        module = _load_file(where)
        source = os.path.abspath(where)
    else:
        module = _import_module(where)
        source = getattr(module, "__file__", None)
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = _candidates(vars(module))
            hint = f"it defines: {', '.join(names)}" if names else "it defines no nn.Module class"
            raise ArchscanError(f"{where} has no {attr!r}", hint=hint)
        obj = getattr(obj, part)
    if isinstance(obj, nn.Module):
        return ModelTarget(target, None, instance=obj, source_file=source)
    if not callable(obj):
        kind = type(obj).__name__
        raise ArchscanError(f"{target} is {'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}, not a module class or factory",
                            hint="point archscan at an nn.Module class, a function returning one, or an instance")
    return ModelTarget(target, obj, source_file=source)


# --- what the library's callers hand over: models and inputs in any of their forms ---------------

InputLike = InputSpec | str | Sequence[int] | torch.Tensor  # or lists, tuples, dicts and dataclasses of them


def _is_shape(x: Any) -> bool:
    return isinstance(x, torch.Size) or (isinstance(x, (tuple, list)) and all(isinstance(d, int) for d in x))


def _to_spec(x: InputLike) -> InputSpec:
    if isinstance(x, InputSpec):
        return x
    if isinstance(x, str):
        return parse_input_spec(x)
    if isinstance(x, torch.Tensor):  # its values are used where a run needs them
        return InputSpec(tuple(int(s) for s in x.shape), x.dtype, example=x.detach())
    if _is_shape(x) and x:
        return InputSpec(tuple(int(d) for d in x))
    raise ArchscanError(f"cannot read an input spec from {_described(x)}",
                        hint="give a shape tuple, '1,3,224,224' or a tensor, or lists, tuples, dicts and "
                             "dataclasses of them")


def _described(x: Any) -> str:
    """What a value is, in a few words (never a tensor's values)."""
    if isinstance(x, torch.Tensor):
        return f"a {dtype_name(x.dtype)} tensor of shape {list(x.shape)}"
    if isinstance(x, (list, tuple, dict)) and not x:
        return f"an empty {type(x).__name__}"
    kind = type(x).__name__
    text = repr(x) if isinstance(x, (int, float, str, bool, type(None))) else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
    return text if len(text) <= 60 else text[:57] + "..."


def input_leaves(x: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """The tensors (or shapes, specs) of a nested input (lists, tuples, dicts, dataclasses), each
    with its place in it (``InputSpec.path``)."""
    if isinstance(x, (InputSpec, str, torch.Tensor)):
        return [(path, x)]
    if isinstance(x, dict):
        if not x:
            raise ArchscanError("cannot read an input spec from an empty dict", hint="give its tensors")
        return [leaf for k, v in x.items() for leaf in input_leaves(v, path + (("dict", k),))]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [leaf for f in dataclasses.fields(x) if getattr(x, f.name) is not None
                for leaf in input_leaves(getattr(x, f.name), path + ((type(x), f.name),))]
    if isinstance(x, (list, tuple)) and not _is_shape(x):
        kind = "tuple" if isinstance(x, tuple) else "list"
        return [leaf for i, v in enumerate(x) for leaf in input_leaves(v, path + ((kind, i),))]
    return [(path, x)]


def _specs_of(x: Any, name: str | None = None, arg: int | None = None) -> list[InputSpec]:
    """One forward argument's specs: a flat one, or each tensor of a nested one with its place."""
    out = []
    for path, leaf in input_leaves(x):
        spec = _to_spec(leaf)
        out.append(dataclasses.replace(spec, name=name if name is not None else spec.name, path=path,
                                       arg=None if name is not None or not path else arg) if path or name else spec)
    return out


def to_target(model: Any, name: str | None = None, allow_pickle: bool = False) -> ModelTarget:
    if isinstance(model, ModelTarget):
        return model
    if isinstance(model, str):
        return resolve_target(model, allow_pickle)
    if isinstance(model, nn.Module):
        return ModelTarget(name or type(model).__name__, None, instance=model)  # copied before faking
    if callable(model):
        return ModelTarget(name or getattr(model, "__name__", "model"), model)
    raise ArchscanError(f"cannot analyse a {type(model).__name__}", hint="give an nn.Module, a class, a factory or 'file.py:Name'")


def model_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``--dtype`` as a torch dtype (floating point only)."""
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    if dtype is not None and not dtype.is_floating_point:
        raise ArchscanError(f"--dtype {dtype_name(dtype)} is not a floating-point dtype", hint="use float32, float16 or bfloat16")
    return dtype


def input_specs(inputs: Sequence[InputLike] | InputLike | dict, dtype: torch.dtype | None = None) -> list[InputSpec]:
    """``scan``'s ``inputs`` argument as specs; float32 inputs take the model's ``dtype``."""
    if isinstance(inputs, (InputSpec, str, torch.Tensor)) or (inputs and _is_shape(inputs)):
        inputs = [inputs]  # one input, not a list of them
    if isinstance(inputs, dict):  # forward's keyword arguments: {"input_ids": "1,16:int64", ...}, each may nest
        flat = [s for k, v in inputs.items() for s in _specs_of(v, str(k))]
    else:  # forward's arguments in order; a list, tuple, dict or dataclass among them nests
        flat = [s for i, x in enumerate(inputs) for s in _specs_of(x, arg=i)]
    specs = [dataclasses.replace(s, dtype=dtype) if dtype is not None and s.dtype == torch.float32 else s
             for s in flat]
    if not specs:
        raise ArchscanError("no input given", hint="pass --input 1,3,224,224 (repeat for several inputs)")
    return specs


def check_kwargs(target: ModelTarget, kwargs: dict | None) -> None:
    """Constructor arguments need something to construct: a module instance takes none."""
    if target.instance is not None and kwargs:
        raise ArchscanError(f"{target.name} is a module instance: --kwargs cannot be applied to it",
                            hint="point archscan at the class or a factory to pass constructor arguments")
