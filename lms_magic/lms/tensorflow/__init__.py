"""LMS on Keras's TensorFlow backend: the train step's graph rewritten, replayed and explained."""
