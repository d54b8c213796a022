"""Why a fit does not fit, and what will, from the step's replay.

``replay.py`` (``explained``: the step's peak by kind and by Keras layer, the largest batch each way of training
fits, the frontier; ``sizing/explain_fit.py`` adds the steps measured on the device) over ``predictors.py`` (one
backend predictor per way of training, each answering ``core.prediction.StepPredictor``) and ``largest.py`` (the
largest batch that fits, searched over the prediction and confirmed by measured steps: pure); ``results.py`` holds
what it finds.
``account.py`` is the out-of-memory account: the text the ``LMS`` callback and the magics print above an
out-of-memory error, and the magics' catch of it. ``step.py`` is ``predict_step``, one step's peaks at one batch.
"""
