"""Stand-ins for tests: a scripted LMS backend (``backends.py``) and fake NVML, clocks and allocators
(``memory.py``). Nothing in the package imports them."""
