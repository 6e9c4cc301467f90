"""Local mode: ``longtail run FILE`` runs an RLJob on one machine as worker processes.

``run`` (the entry point the CLI calls), ``launcher`` (child processes on loopback ports),
``coordinator`` (the local transport of ``longtail_api.harvestloop``), ``progress``
(progress bar and live line), ``report`` (plots and the summary). Submodules are imported
directly.
"""
