"""LMS on Keras's PyTorch backend: saved activations offloaded through autograd's saved-tensor hooks."""
