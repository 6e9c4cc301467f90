"""``longtail profile``: measure an engine on this machine and write an engine profile file.

Called by the CLI (``longtail profile``, ``longtail_cli.main``), which hands its arguments to
:func:`longtail_workers.profile.main.main`. The file (:class:`longtail_api.profile.
EngineProfile`) calibrates the step simulator (``longtail simulate``). A program at the top of the
worker layers: it times the project's own pieces (the torch engine's target forward and KV
cache, the EAGLE drafter, the drafter trainer's packed loss step, the GRPO update), never copies
of them.
"""
