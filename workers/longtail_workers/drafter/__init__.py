"""The drafter's one home: the EAGLE-style model and everything that stores or moves it.

``model`` (the module), ``pairs`` (the training-pair convention the engine's draft step also
follows), ``loss`` (TLT's loss), ``checkpoint`` (save/load of the trainable weights),
``registry`` (versions, ``LATEST`` and per-window candidates), ``merge`` (token-weighted
averaging of candidates), ``vetting`` (is a candidate this job's drafter), ``exchange`` (the
same registry over the trainer's HTTP port) and ``export`` (the EAGLE-1 layout serving engines
load). A library: it imports nothing above it (no engine, no programs); offline fitting is in
``longtail_workers.warmstart``. Submodules are imported directly.
"""
