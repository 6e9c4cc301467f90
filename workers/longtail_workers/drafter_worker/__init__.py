"""The dedicated drafter worker (``longtail worker drafter``, ``spec.drafter``).

``wire`` is the trainer's ``GET /v1/samples/latest`` (the step's answers) and its client,
``worker`` the loop (one drafter window per completed step), ``service`` the process (CLI
entry point, HTTP surface). The window itself is ``spot/sequences.py``, shared with the
trainer's own harvest. Submodules are imported directly.
"""
