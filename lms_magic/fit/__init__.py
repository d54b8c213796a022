"""Fair runs of a Keras fit: the same start (weights, optimizer state, seed, batches) for every variant, with and
without LMS, measured alike (``compare.py``, ``runs.py``, ``snapshot.py``), the cell's fit calls routed to them
(``intercept.py``), and their results (``results.py``)."""
