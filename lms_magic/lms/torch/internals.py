"""Keras's private API that the PyTorch backend reads while a step runs: the layers being called, from Keras's
name-scope stack. A Keras release that moves it breaks here (``lms_magic/versions.py`` holds the tested range).
And PyTorch's own: its cuBLAS handles' cached workspaces, let go of so that a run makes them again."""

from __future__ import annotations


def current_keras_layer() -> tuple[str, str]:
    """The innermost Keras layer being called (name, class name), from Keras's name-scope stack; ("", "") outside."""
    from keras.src.backend.common import global_state

    for scope in reversed(global_state.get_global_attribute("name_scope_stack") or []):
        caller = getattr(scope, "caller", None)
        if caller is not None and hasattr(caller, "built"):
            return caller.name, type(caller).__name__
    return "", ""


def current_keras_layer_path() -> str:
    """The Keras layers being called, outermost first, less the model itself ("backbone/block_0/attention"), from
    Keras's name-scope stack; the model's name where only it is; "loss" outside any (a PyTorch step computes
    the loss outside the model's call, and Keras's metrics save nothing for the backward pass)."""
    from keras.src.backend.common import global_state

    callers = [scope.caller for scope in global_state.get_global_attribute("name_scope_stack") or []
               if hasattr(getattr(scope, "caller", None), "built")]
    if not callers:
        return "loss"
    return "/".join(caller.name for caller in callers[1:]) or callers[0].name


def cublas_workspaces_released() -> bool:
    """PyTorch's cached cuBLAS workspaces (one a handle and stream, 32 MiB each on an H200) given back to its
    allocator: the next matrix product makes its own again, and a run then shows them. False where this PyTorch
    has no such call."""
    import torch

    release = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if release is None:
        return False
    release()
    return True
