"""Large Model Support: swap activations to host memory between forward and backward.

plan.py and simulate.py are pure (no framework imports); tensorflow.py rewrites
TensorFlow's traced train step; callback.py is the Keras callback users add.
"""
