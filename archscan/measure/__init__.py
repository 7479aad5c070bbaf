"""Measure the truth: per-node and end-to-end latency, device calibration, roofline prediction."""

from .predict import apply_predictions, kernels, predict_node
from .profile import (MAX_OVERHEAD_MS, DeviceProfile, ProfileError, cache_dir, cached_profile, calibrate, check_profile_dir,
                      datasheet_profile, device_name, instability, instability_error, load_profile, resolve_device, save_profile)
from .run import MeasureOptions, check_options, measure_report
from .timing import UNSTABLE_SPREAD, CpuClock, CudaClock, TimingStats, is_unstable, summarize, time_fn, time_stable

__all__ = ["MAX_OVERHEAD_MS", "UNSTABLE_SPREAD", "DeviceProfile", "MeasureOptions", "ProfileError", "cached_profile", "check_options", "check_profile_dir", "TimingStats", "CpuClock", "CudaClock", "apply_predictions", "cache_dir",
           "calibrate", "datasheet_profile", "device_name", "instability", "instability_error", "is_unstable", "kernels", "load_profile", "measure_report", "predict_node", "resolve_device",
           "save_profile", "summarize", "time_fn", "time_stable"]
