"""The step simulator: what an RLJob's step costs on given hardware, from an engine profile.

``latency`` (a profile's curves interpolated), ``worker`` (one rollout worker's continuous
batching with the job's adaptive SD policy), ``step`` (dispatch, harvest, trainer, weight sync;
baseline vs Longtail) and ``roofline`` (a first-principles GPU profile, used only where no
measured profile exists). Called by ``longtail simulate``. Pure Python (no torch), so it runs
anywhere; submodules are imported directly.
"""
