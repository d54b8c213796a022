"""The batch a fit can train at, held to the device: ``explain_fit`` with its closed loop, and ``largest_batch``."""
