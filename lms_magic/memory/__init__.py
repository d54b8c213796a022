"""Measuring memory: host RSS, NVML, framework allocators, and the profiler over them."""
