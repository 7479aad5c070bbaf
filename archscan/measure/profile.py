"""Device profiles: measured once with micro-benchmarks, cached, used by the roofline prediction.

``archscan calibrate`` measures dense matmul throughput per dtype (multiply-adds per second),
memory bandwidth (a large copy: bytes read + written per second) and the per-kernel launch
overhead (a one-element add). The profile is saved as JSON under the cache directory:
``$ARCHSCAN_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/archscan`` or ``~/.cache/archscan``,
in ``profiles/<device key>.json``.

Each quantity records the spread of the timing that measured it (``DeviceProfile.spread``); an
unstable one is measured again (``timing.time_stable``). ``instability`` names what is still
unstable, or a per-call overhead too large to be one (``MAX_OVERHEAD_MS``): ``archscan calibrate``
refuses to cache such a profile unless forced, and a scan warns about one that was forced.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ArchscanError, DeviceError
from ..files import write_file
from .timing import UNSTABLE_SPREAD, Clock, clock_for, is_unstable, time_back_to_back, time_stable

# No per-call overhead of a real op is this large. A kernel launch costs 5-20 us on a GPU and
# dispatching a small op on a CPU 1-60 us (this project's 2-core VM: a ReLU module call 1.7 us,
# a 7x7 depthwise conv 55 us beyond its rate); a thousand microseconds is a time slice the
# scheduler gave another process (1-20 ms), not the op. A profile carrying it predicts every
# small layer far too slow -- it happened, 1000x -- so it is treated as unstable.
MAX_OVERHEAD_MS = 1.0


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class DeviceProfile:
    """What a device can do: peak multiply-adds/s per dtype, bytes/s, and overhead per kernel."""

    device: str
    name: str
    threads: int | None
    peak_flops: dict[str, float]     # dtype name -> multiply-adds per second
    bandwidth: float                 # bytes per second (read + write)
    launch_overhead_ms: float        # per kernel, host dispatch included
    created: str
    torch_version: str
    class_flops: dict[str, float] = dataclasses.field(default_factory=dict)      # category -> multiply-adds/s (fp32)
    class_bandwidth: dict[str, float] = dataclasses.field(default_factory=dict)  # category -> bytes/s
    class_overhead_ms: dict[str, float] = dataclasses.field(default_factory=dict)  # category -> ms per call
    # quantity -> spread (interquartile range / median) of the timing that measured it; keys name
    # the field, with the dtype or category after a dot: "peak_flops.float32", "bandwidth",
    # "launch_overhead_ms", "class_flops.conv", "class_bandwidth.norm", "class_overhead_ms.conv"
    spread: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        return profile_key(self.device, self.name, self.threads)

    def flops_for(self, dtype: str | None, category: str | None = None) -> float:
        """Achievable multiply-adds/s: the op class's measured rate when there is one (scaled from
        float32 to the dtype by the matmul peaks), else the dtype's matmul peak."""
        fp32 = self.peak_flops.get("float32") or max(self.peak_flops.values())
        peak = self.peak_flops.get(dtype or "float32") or fp32
        rate = self.class_flops.get(category or "")
        return rate * peak / fp32 if rate else peak

    def overhead_for(self, category: str | None = None) -> float:
        """Per-call floor of an op class (its time on a tiny input), else the launch overhead."""
        return self.class_overhead_ms.get(category or "", self.launch_overhead_ms)

    def bandwidth_for(self, category: str | None = None) -> float:
        """Bytes/s an op class achieves (measured), else the copy bandwidth."""
        return self.class_bandwidth.get(category or "") or self.bandwidth

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "DeviceProfile":
        """The profile ``to_json`` wrote; ValueError when ``data`` is not one."""
        if not isinstance(data, dict):
            raise ValueError(f"a profile is a JSON object, not {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        required = [n for n, f in fields.items() if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        rates = [data["peak_flops"], data.get("class_flops", {}), data.get("class_bandwidth", {}),
                 data.get("class_overhead_ms", {}), data.get("spread", {})]
        numbers = [data["bandwidth"], data["launch_overhead_ms"]]
        if not all(isinstance(r, dict) and all(_is_number(v) for v in r.values()) for r in rates) \
                or not data["peak_flops"] or not all(_is_number(v) for v in numbers) or data["bandwidth"] <= 0:
            raise ValueError("rates are not positive numbers")
        return cls(**{k: v for k, v in data.items() if k in fields})


def cache_dir() -> Path:
    """Where profiles live (see module docstring)."""
    if os.environ.get("ARCHSCAN_CACHE_DIR"):
        return Path(os.environ["ARCHSCAN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "archscan"


def profile_key(device: str, name: str, threads: int | None) -> str:
    kind = torch.device(device).type
    slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")[:60]
    return f"{kind}-{slug}" + (f"-{threads}t" if kind == "cpu" and threads else "")


def device_name(device: torch.device) -> str:
    """'NVIDIA H200' or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def resolve_device(name: str | None) -> torch.device:
    """'cuda' when available unless a device is named; a clear error for one that is not there."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise DeviceError(f"unknown device {name!r}", hint="use cpu or cuda (cuda:N)") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("CUDA is not available on this machine", hint="use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"no {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        raise DeviceError(f"device {name!r} is not supported", hint="use cpu or cuda")
    return device


def profile_path(key: str) -> Path:
    return cache_dir() / "profiles" / f"{key}.json"


def check_profile_dir(directory: Path | None = None) -> Path:
    """The profile directory, created if need be; an error now if a profile could not be written there."""
    directory = directory or cache_dir() / "profiles"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ArchscanError(f"cannot save device profiles in {directory}: {exc.strerror or exc}",
                            hint="set ARCHSCAN_CACHE_DIR to a writable directory") from exc
    return directory


def save_profile(profile: DeviceProfile, path: Path | None = None) -> Path:
    """Write the profile as JSON; atomically, so a failed write leaves the previous profile whole."""
    path = path or profile_path(profile.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(profile.to_json(), indent=1), "the device profile")
    return path


class ProfileError(ArchscanError):
    """A cached device profile that cannot be read: the static analysis goes on without predictions."""


def load_profile(device: torch.device, threads: int | None = None, path: Path | None = None) -> DeviceProfile | None:
    """The cached profile of this device (and CPU thread count), or None when there is none.

    Raises:
        ProfileError: the cached file is unreadable or damaged (names the file).
    """
    if path is None:
        threads = threads if device.type == "cpu" else None
        path = profile_path(profile_key(str(device), device_name(device), threads or torch.get_num_threads()
                                        if device.type == "cpu" else None))
    if not path.exists():
        return None
    try:
        return DeviceProfile.from_json(json.loads(path.read_text()))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProfileError(f"the device profile {path} cannot be read ({why}); latency predictions skipped",
                           hint="run `archscan calibrate` again") from exc


# --- datasheet profiles: a named GPU without the GPU -------------------------------------------------
#
# The fraction of a datasheet peak each op class reaches, chosen from published measurements:
# - matrix products (``matmul``, ``linear``): 0.70. Large cuBLAS GEMMs reach 70-80% of the dense
#   tensor-core peak (NVIDIA's H100 and A100 GEMM benchmarks; the FlashAttention-2 paper quotes
#   cuBLAS at about 70% of A100's BF16 peak for its GEMMs).
# - attention: 0.50. FlashAttention-2 reaches 50-73% of A100's peak in the forward pass; it is lower
#   at short sequences and head dims under 128 (Dao, "FlashAttention-2", 2023, figures 4-6).
# - convolution: 0.55. cuDNN convolutions of CNN layers run below large GEMMs (fewer FLOPs per
#   byte, im2col-free kernels tuned per shape).
# - memory bandwidth: 0.80 of the datasheet figure. STREAM-like copies reach 80-90% of HBM
#   bandwidth on A100 and H100.
# - per-kernel overhead: 5 µs, PyTorch's eager dispatch and a CUDA launch.
DATASHEET_CLASS_EFFICIENCY = {"matmul": 0.70, "linear": 0.70, "attention": 0.50, "conv": 0.55,
                              "grouped_conv": 0.30, "depthwise_conv": 0.10}
DATASHEET_BANDWIDTH_EFFICIENCY = 0.80
DATASHEET_OVERHEAD_MS = 0.005


def datasheet_profile(name: str) -> DeviceProfile:
    """The profile of a named GPU from its datasheet (``archscan.devices.gpus``), for predictions without
    the device: dense peaks per dtype times the efficiencies above. One line for a name with no
    datasheet compute figures."""
    from ..devices.gpus import GPUS, gpu

    found = gpu(name)
    if found is None or found.bf16_tflops is None:
        names = ", ".join(sorted({g.name for g in GPUS.values() if g.bf16_tflops is not None}))
        raise ArchscanError(f"no datasheet profile for {name!r}", hint=f"use one of: {names}")
    fp32 = found.fp32_tflops * 1e12 / 2  # multiply-adds per second
    half = found.bf16_tflops * 1e12 / 2
    bandwidth = found.bandwidth_tbs * 1e12
    return DeviceProfile(
        device="cuda", name=f"{found.name} (datasheet)", threads=None,
        peak_flops={"float32": fp32, "bfloat16": half, "float16": half},
        bandwidth=bandwidth * DATASHEET_BANDWIDTH_EFFICIENCY, launch_overhead_ms=DATASHEET_OVERHEAD_MS,
        created=f"datasheet: {found.source}", torch_version="",
        class_flops={cat: eff * fp32 for cat, eff in DATASHEET_CLASS_EFFICIENCY.items()})


def cached_profile(device: torch.device, threads: int | None = None) -> tuple[DeviceProfile | None, list[str]]:
    """``load_profile``, with a damaged cache turned into a warning: it costs the predictions, not the analysis.
    An unstable profile (saved with ``--force``, or by an archscan that did not check) predicts with a warning."""
    try:
        profile = load_profile(device, threads)
    except ProfileError as exc:
        return None, [str(exc)]
    problems = instability(profile) if profile is not None else {}
    if not problems:
        return profile, []
    return profile, [f"the device profile of {profile.device} ({profile.name}, calibrated {profile.created[:10]}) is "
                     f"unstable (a spread over {100 * UNSTABLE_SPREAD:.0f}% or a per-call overhead over "
                     f"{MAX_OVERHEAD_MS * 1e3:.0f} us): {_listing(problems)}; latency predictions from it may be far "
                     "off (run `archscan calibrate` again on an idle machine)"]


def instability(profile: DeviceProfile) -> dict[str, str]:
    """What in a profile cannot be trusted, by quantity (the keys of ``DeviceProfile.spread``): a
    spread above ``timing.UNSTABLE_SPREAD``, or a per-call overhead above ``MAX_OVERHEAD_MS``."""
    problems = {key: f"spread {100 * s:.0f}%" for key, s in profile.spread.items() if is_unstable(s)}
    overheads = {"launch_overhead_ms": profile.launch_overhead_ms,
                 **{f"class_overhead_ms.{cat}": ms for cat, ms in profile.class_overhead_ms.items()}}
    for key, ms in overheads.items():
        if ms > MAX_OVERHEAD_MS:
            why = f"{ms * 1e3:.0f} us per call"
            problems[key] = f"{problems[key]} and {why}" if key in problems else why
    return problems


def instability_error(profile: DeviceProfile) -> DeviceError | None:
    """The error that refuses to cache an unstable profile (see ``instability``), or None when it is stable."""
    problems = instability(profile)
    if not problems:
        return None
    advice = (f"close other programs, calibrate with --threads below the {os.cpu_count()} cores"
              if torch.device(profile.device).type == "cpu" else "stop other processes using the GPU")
    return DeviceError(f"the calibration of {profile.device} is unstable (a spread over {100 * UNSTABLE_SPREAD:.0f}% "
                       f"or a per-call overhead over {MAX_OVERHEAD_MS * 1e3:.0f} us), so the profile was not saved: "
                       f"{_listing(problems)}",
                       hint=f"{advice} and run `archscan calibrate` again, or pass --force to save it anyway")


def _listing(problems: dict[str, str], limit: int = 4) -> str:
    """'bandwidth spread 43%; class_overhead_ms.conv spread 31% and 9400 us per call; ... (6 in all)'."""
    items = [f"{key} {why}" for key, why in problems.items()]
    return "; ".join(items[:limit]) + (f"; ... ({len(items)} in all)" if len(items) > limit else "")


# --- micro-benchmarks ---------------------------------------------------------------------------

# Each returns (quantity, spread of the timing that measured it).

def _matmul_rate(n: int, dtype: torch.dtype, device: torch.device, clock: Clock, budget_ms: float) -> tuple[float, float]:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    stats = time_stable(lambda: torch.mm(a, b), clock, warmup=1, min_repeats=3, budget_ms=budget_ms)
    return n ** 3 / (stats.median_ms / 1e3), stats.spread


def _copy_bandwidth(nbytes: int, device: torch.device, clock: Clock, budget_ms: float) -> tuple[float, float]:
    x = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_()
    y = torch.empty_like(x)
    stats = time_stable(lambda: y.copy_(x), clock, warmup=2, min_repeats=5, budget_ms=budget_ms)
    return 2 * nbytes / (stats.median_ms / 1e3), stats.spread


def _launch_overhead_ms(device: torch.device, clock: Clock) -> tuple[float, float]:
    """Per-layer cost of launching one tiny kernel through an nn.Module call, as eager models do."""
    x = torch.ones(1, device=device)
    layer = torch.nn.ReLU()
    calls = 200

    def many():
        for _ in range(calls):
            layer(x)

    stats = time_stable(many, clock, warmup=2, min_repeats=10, budget_ms=100)
    return stats.median_ms / calls, stats.spread


def _class_ops(device: torch.device, hw: int, c: int, batch: int = 1) -> dict[str, tuple]:
    """One representative op per class on a [batch, c, hw, hw] map: (callable, multiply-adds, bytes moved)."""
    import torch.nn.functional as F

    x = torch.randn(batch, c, hw, hw, device=device)
    n = x.numel()
    mean, var = torch.zeros(c, device=device), torch.ones(c, device=device)
    w3, w1g, wdw = (torch.randn(c, c, 3, 3, device=device), torch.randn(c, c // 4, 1, 1, device=device),
                    torch.randn(c, 1, 3, 3, device=device))
    wl = torch.randn(c, c, device=device)
    rows = x.reshape(-1, c)
    return {
        "conv": (lambda: F.conv2d(x, w3, padding=1), n * c * 9, 4 * (2 * n + w3.numel())),
        "grouped_conv": (lambda: F.conv2d(x, w1g, groups=4), n * c // 4, 4 * (2 * n + w1g.numel())),
        "depthwise_conv": (lambda: F.conv2d(x, wdw, padding=1, groups=c), n * 9, 4 * (2 * n + wdw.numel())),
        "linear": (lambda: F.linear(rows, wl), rows.shape[0] * c * c, 4 * (2 * n + wl.numel())),
        "norm": (lambda: F.batch_norm(x, mean, var, mean, var, False), 0, 2 * n * 4),
        "activation": (lambda: F.relu(x), 0, 2 * n * 4),
        "elementwise": (lambda: torch.add(x, x), 0, 2 * n * 4),
        "pooling": (lambda: F.max_pool2d(x, 3, 2, 1), 0, n * 4 * 5 // 4),
        "data_movement": (lambda: torch.cat([x, x], 1), 0, 4 * n * 4),
    }


# The map the class rates are measured on. On the CPU [1, 64, 56, 56], a mid-network layer at batch
# 1. A GPU runs that in a few microseconds, under the host's dispatch: the rate would measure the
# dispatch (it did: norms at 80 GB/s on an H200 that copies 4.2 TB/s, every prediction 3-10x too
# slow). There the map fills the device: [16, 128, 56, 56], 25.7 MB in float32.
_RATE_MAP = {"cpu": dict(batch=1, hw=56, c=64), "cuda": dict(batch=16, hw=56, c=128)}
_QUICK_RATE_MAP = {"cpu": dict(batch=1, hw=28, c=64), "cuda": dict(batch=4, hw=56, c=64)}
# A decode step's linear layers are matrix-vector products, bound by reading the weights: their
# bandwidth, measured on a GPU on Llama-3-8B's MLP shape (8 rows of 4,096 against 14,336 x 4,096
# bf16 weights, 117 MB), is below a copy's.
_SKINNY_LINEAR = (8, 4096, 14336)


def _class_rates(device: torch.device, clock: Clock, budget_ms: float, quick: bool,
                 peak_fp32: float | None = None, gpu: bool | None = None) -> tuple[dict, dict, dict, dict]:
    """What each op class reaches (float32): multiply-adds/s or bytes/s on ``_RATE_MAP``'s map, and
    its per-call overhead: the time of the same op on a [1, 64, 7, 7] map (a late-stage layer at
    batch 1) beyond what those rates predict for it, timed back to back as a forward runs it.

    Dense, grouped and depthwise convolutions reach very different fractions of the matmul peak,
    norms/activations/pools of the copy bandwidth, and on a CPU a small conv costs far more than a
    small add just to set up; the roofline uses what each class reaches. On a GPU a linear layer
    is the matmul it calls, whose rate is the matmul peak (``peak_fp32``), and its bandwidth is a
    skinny product's (``_SKINNY_LINEAR``). The fourth dict holds the spreads, keyed as
    ``DeviceProfile.spread``. ``gpu``: measure as on a GPU (default: whether ``device`` is one).
    """
    gpu = device.type == "cuda" if gpu is None else gpu
    flops, bandwidth, overhead, spread = {}, {}, {}, {}
    shape = (_QUICK_RATE_MAP if quick else _RATE_MAP)["cuda" if gpu else "cpu"]
    for category, (fn, macs, nbytes) in _class_ops(device, **shape).items():
        if gpu and category == "linear":
            continue
        stats = time_back_to_back(fn, clock, warmup=2, min_repeats=5, budget_ms=budget_ms)
        if macs:
            flops[category] = macs / (stats.median_ms / 1e3)
        else:
            bandwidth[category] = nbytes / (stats.median_ms / 1e3)
        spread[f"class_{'flops' if macs else 'bandwidth'}.{category}"] = stats.spread
    if gpu:
        rows, k, m = _SKINNY_LINEAR
        x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        stats = time_back_to_back(lambda: torch.nn.functional.linear(x, w), clock, warmup=2, min_repeats=5,
                                  budget_ms=budget_ms)
        bandwidth["linear"] = 2 * (rows * k + m * k + rows * m) / (stats.median_ms / 1e3)
        spread["class_bandwidth.linear"] = stats.spread
    for category, (fn, macs, nbytes) in _class_ops(device, 7, 64).items():
        stats = time_back_to_back(fn, clock, warmup=2, min_repeats=10, budget_ms=budget_ms / 4)
        roof_ms = 1e3 * (macs / (flops.get(category) or peak_fp32) if macs else nbytes / bandwidth[category])
        overhead[category] = max(stats.median_ms - roof_ms, 0.0)
        spread[f"class_overhead_ms.{category}"] = stats.spread
    return flops, bandwidth, overhead, spread


def calibrate(device: str | torch.device | None = None, threads: int | None = None, quick: bool = False,
              progress=None) -> DeviceProfile:
    """Measure a device: matmul multiply-adds/s per dtype, copy bandwidth, launch overhead, and the
    spread of each (an unstable one is timed again; ``instability`` says what still is).

    Args:
        device: 'cpu', 'cuda', 'cuda:1'; None picks cuda when available.
        threads: CPU threads to use (default: torch's current setting).
        quick: smaller problems and budgets (for tests).
        progress: optional callable(str) told what is being measured.
    """
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    previous_threads = torch.get_num_threads()
    if dev.type == "cpu" and threads:
        torch.set_num_threads(threads)
    try:
        return _calibrate(dev, quick, progress)
    finally:
        torch.set_num_threads(previous_threads)


def _calibrate(dev: torch.device, quick: bool, progress) -> DeviceProfile:
    clock = clock_for(dev)
    say = progress or (lambda _msg: None)
    budget = 20.0 if quick else 200.0
    if dev.type == "cuda":
        sizes = [1024] if quick else [2048, 4096, 8192]
        dtypes = [torch.float32, torch.float16, torch.bfloat16]
        copy_bytes = (64 if quick else 1024) * 2**20
    else:
        sizes = [128] if quick else [256, 512, 1024, 2048]
        dtypes = [torch.float32] if quick else [torch.float32, torch.bfloat16]
        copy_bytes = (8 if quick else 256) * 2**20
    peak: dict[str, float] = {}
    spread: dict[str, float] = {}
    with torch.inference_mode():
        for dt in dtypes:
            name = str(dt).removeprefix("torch.")
            say(f"matmul {name}")
            rates = []
            for n in sizes:
                rates.append(_matmul_rate(n, dt, dev, clock, budget))
                if n ** 3 / rates[-1][0] > 0.25:
                    break  # this dtype is slow here (e.g. bf16 without CPU support): larger sizes add nothing
            peak[name], spread[f"peak_flops.{name}"] = max(rates, key=lambda r: r[0])  # the fastest size
        say("memory bandwidth")
        bandwidth, spread["bandwidth"] = _copy_bandwidth(copy_bytes, dev, clock, budget)
        say("launch overhead")
        overhead, spread["launch_overhead_ms"] = _launch_overhead_ms(dev, clock)
        say("conv, norm, activation, pooling rates")
        class_flops, class_bandwidth, class_overhead, class_spread = _class_rates(dev, clock, budget / 2, quick,
                                                                                  peak["float32"])
    return DeviceProfile(
        device=str(dev), name=device_name(dev), threads=torch.get_num_threads() if dev.type == "cpu" else None,
        peak_flops=peak, bandwidth=bandwidth, launch_overhead_ms=overhead,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), torch_version=torch.__version__,
        class_flops=class_flops, class_bandwidth=class_bandwidth, class_overhead_ms=class_overhead,
        spread={**spread, **class_spread},
    )
