"""The syntax of ``--input`` and ``--dtype``, checked without importing torch, so a typo on the
command line costs a tenth of a second, not the two of a torch import. ``archscan.load.targets``
turns the checked text into torch dtypes and ``InputSpec``s.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable

from ..errors import ArchscanError

# dtypes a model input can have: quantized, complex and float8 tensors cannot be made as random
# example inputs, and models take them through their own conversion code
INPUT_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
            "uint8": 1, "bool": 1}
ALIASES = {"fp32": "float32", "float": "float32", "f32": "float32", "fp16": "float16", "half": "float16",
           "f16": "float16", "bf16": "bfloat16", "fp64": "float64", "double": "float64", "long": "int64",
           "int": "int32", "i64": "int64", "i32": "int32", "short": "int16"}

_DTYPE_HINT = "use float32, float16, bfloat16, float64, int64, int32, int16, int8, uint8 or bool"


def dtype_key(text: str, is_torch_dtype: Callable[[str], bool] = lambda key: False) -> str:
    """The canonical name of an input dtype ('bf16' -> 'bfloat16'); an ArchscanError otherwise,
    saying 'not supported for inputs' for names ``is_torch_dtype`` knows and 'unknown' for the rest."""
    key = text.strip().lower().removeprefix("torch.")
    key = ALIASES.get(key, key)
    if key in INPUT_DTYPES:
        return key
    what = "not supported for inputs" if is_torch_dtype(key) else "unknown"
    if key in ("qint8", "quint8", "qint32", "quint4x2", "int4", "fp8") or key.startswith("float8"):
        raise ArchscanError(f"dtype {text!r} is {what}: quantization is a scheme applied to a model's layers",
                            hint="analyse the model quantized with --quant int8, w8a8, fp8 or int4 (archscan[quant])")
    raise ArchscanError(f"dtype {text!r} is {what}", hint=_DTYPE_HINT)


_VALUES = re.compile(r"=\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


def split_values(text: str) -> tuple[str, tuple[int, int] | None]:
    """'4:int64=1..50' -> ('4:int64', (1, 50)): the spec and the range its integer values are
    drawn from (uniform, seeded, both ends included); None when it gives none."""
    found = _VALUES.search(text)
    if not found:
        return text, None
    low, high = int(found.group(1)), int(found.group(2))
    head = text[:found.start()]
    dtype = head.rpartition(":")[2].strip().lower().removeprefix("torch.") if ":" in head else "float32"
    if ALIASES.get(dtype, dtype) not in INTEGER_DTYPES:
        raise ArchscanError(f"--input {text!r}: values LOW..HIGH are for integer inputs",
                            hint="give the dtype: --input 4:int64=1..50")
    if low > high:
        raise ArchscanError(f"--input {text!r}: the range {low}..{high} is empty", hint="write LOW..HIGH with LOW <= HIGH")
    return head, (low, high)


def spec_text(shape, dtype: str, name: str | None = None, values: tuple[int, int] | None = None) -> str:
    """The ``--input`` text of a spec (``split_input_spec``/``split_values`` read it back)."""
    text = ",".join(str(d) for d in shape) + ("" if dtype == "float32" else f":{dtype}")
    text += f"={values[0]}..{values[1]}" if values else ""
    return f"{name}={text}" if name else text


_STEP = re.compile(r"\[(\d+)\]|\.([A-Za-z_]\w*)")


def split_argument(name: str) -> tuple[str, tuple[tuple[str, Any], ...]] | None:
    """'images[1]' -> ('images', (('list', 1),)); 'added_cond_kwargs.time_ids' -> ('added_cond_kwargs',
    (('dict', 'time_ids'),)): a forward argument and where in it (a list's item, a dict's key) the
    input goes; None when ``name`` is not of that form."""
    base = re.match(r"[A-Za-z_]\w*", name)
    if base is None:
        return None
    steps, at = [], base.end()
    while at < len(name):
        step = _STEP.match(name, at)
        if step is None:
            return None
        steps.append(("list", int(step.group(1))) if step.group(1) is not None else ("dict", step.group(2)))
        at = step.end()
    return base.group(0), tuple(steps)


def path_text(path) -> str:
    """A nested input's place in its argument as ``split_argument`` reads it: '[1]', '.time_ids'."""
    return "".join(f"[{key}]" if kind in ("list", "tuple") else f".{key}" for kind, key in path)


def split_input_spec(text: str) -> tuple[tuple[int, ...], str, str | None]:
    """'1,3,224,224' -> ((1, 3, 224, 224), 'float32', None); '1,128:int64' for token ids;
    'decoder_input_ids=1,16:int64' passes the input to forward by keyword, 'images[0]=3,224,224'
    and 'added_cond_kwargs.time_ids=2,6' as a list's item or a dict's value in it
    (``split_argument``). Unknown dtype names come back as written, for
    ``archscan.load.targets`` to judge. Values (``=1..50``, ``split_values``) are checked and left out."""
    raw = split_values(text.strip())[0]
    name, eq, rest = raw.partition("=")
    name = name.strip()
    if eq and split_argument(name) is None:
        raise ArchscanError(f"malformed --input {text!r}: {name!r} is not an argument name",
                            hint="name a forward argument, and where in it the input goes: --input "
                                 "decoder_input_ids=1,16:int64, --input images[0]=3,224,224, --input "
                                 "added_cond_kwargs.time_ids=2,6")
    raw = rest.strip() if eq else raw
    shape_text, _, dtype_text = raw.partition(":")
    parts = [p.strip() for p in shape_text.replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise ArchscanError(
            f"malformed --input {text!r}",
            hint="write a shape as comma-separated positive integers, optionally with a dtype and a "
            "forward argument name: --input 1,3,224,224, --input 1,128:int64, --input attention_mask=1,128:int64",
        )
    dtype = dtype_text.strip() or "float32"
    key = ALIASES.get(dtype.lower().removeprefix("torch."), dtype.lower().removeprefix("torch."))
    if key in INPUT_DTYPES:
        numel = math.prod(shape)
        if numel * ITEMSIZE[key] >= 2**63:
            raise ArchscanError(f"--input {text!r} is too large: {numel:.3g} elements cannot be addressed",
                                hint="give the shape the model really takes, e.g. --input 1,3,224,224")
        dtype = key
    return shape, dtype, name if eq else None


def check_arguments(target: str, inputs: list[str] | None, dtype: str | None) -> None:
    """The model argument (``check_target``), every ``--input`` and the ``--dtype`` well formed
    (dtype names torch may know are left to ``archscan.load.targets``, which says whether they are
    unknown or unsupported)."""
    check_target(target)
    for text in inputs or []:
        split_input_spec(text)
    if dtype is not None:
        key = dtype.strip().lower().removeprefix("torch.")
        if ALIASES.get(key, key) not in INPUT_DTYPES and not key.replace("_", "").isalnum():
            dtype_key(dtype)


def check_target(target: str) -> None:
    """The model argument names something that is there: a .pt2 or .py file that exists, a zoo
    model, or ``module:name`` (imported later, by ``archscan.load.targets``)."""
    if target.endswith(".pt2") and ":" not in target:
        if not os.path.isfile(target):
            raise ArchscanError(f"{target} is a directory, not a file" if os.path.isdir(target) else f"no such file: {target}",
                                hint="give the path of a .pt2 file written by torch.export.save")
        return
    if target.startswith("zoo:"):
        from ..zoo._catalog import catalog

        name, names = target[4:], catalog()
        if name not in names:
            import difflib

            close = difflib.get_close_matches(name, sorted(names), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "run `archscan zoo` to list the zoo"
            raise ArchscanError(f"no zoo model named {name!r}", hint=hint)
        return
    if ":" not in target:
        raise ArchscanError(f"cannot tell which model {target!r} means",
                            hint="write FILE.py:Name, package.module:factory or zoo:name")
    where, _, attr = target.rpartition(":")
    if not where.strip():
        raise ArchscanError(f"{target!r} names no file or module before ':'",
                            hint="write FILE.py:Name, package.module:factory or zoo:name")
    if not attr.strip():
        raise ArchscanError(f"{target!r} names no model after ':'", hint="write FILE.py:Name with the class or factory")
    if where.endswith(".py") or os.sep in where or os.path.exists(where):
        if not os.path.exists(where):
            raise ArchscanError(f"model file not found: {where}", hint="check the path before ':'")
        if not os.path.isfile(where):
            raise ArchscanError(f"not a file: {where}", hint="give the Python file that defines the model before ':'")
