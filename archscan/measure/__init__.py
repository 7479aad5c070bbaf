"""Measure the truth: per-node and end-to-end latency, device calibration, roofline prediction."""

from .predict import apply_predictions, kernels, predict_node
from .profile import (DeviceProfile, ProfileError, cache_dir, cached_profile, calibrate, check_profile_dir, device_name, load_profile,
                      resolve_device, save_profile)
from .run import MeasureOptions, check_options, measure_report
from .timing import CpuClock, CudaClock, TimingStats, summarize, time_fn

__all__ = ["DeviceProfile", "MeasureOptions", "ProfileError", "cached_profile", "check_options", "check_profile_dir", "TimingStats", "CpuClock", "CudaClock", "apply_predictions", "cache_dir",
           "calibrate", "device_name", "kernels", "load_profile", "measure_report", "predict_node", "resolve_device",
           "save_profile", "summarize", "time_fn"]
