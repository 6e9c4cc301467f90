"""The dedicated drafter worker (``longtail worker drafter``, ``spec.drafter``).

``worker`` the loop (one drafter window per completed step), ``service`` the process (CLI
entry point, HTTP surface); the body of the trainer's ``GET /v1/samples/latest`` it reads is
``wire/samples.py``. The window itself is ``spot/sequences.py``, shared with the
trainer's own harvest. Submodules are imported directly.
"""
