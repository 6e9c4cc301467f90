"""Experiment tracking (``spec.tracking``): TensorBoard, MLflow and Weights & Biases.

The trainer (rank 0, ``trainer/service.py``) opens a :class:`~.sink.Tracker` and hands it every
step's row; ``longtail run`` (``local/run.py``) reopens the same tracker runs at the end to add
the report, its plots and the exported drafter. ``figures.py`` turns a row into the logged
figures, ``backends.py`` talks to each library, ``sink.py`` keeps a down tracker off the
training path (a background thread per backend with a bounded buffer).
"""
