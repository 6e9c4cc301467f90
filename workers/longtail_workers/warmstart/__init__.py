"""Programs that fit a drafter offline before RL: ``longtail drafter fit`` and ``builtin:tiny``.

``fit`` (roll out the target with an engine, train the drafter on its own states), ``offline``
(the ``longtail drafter fit`` program: sampling, fitting, saving) and ``builtin`` (the built-in
policy's drafter, fitted on first use and cached). These are programs on top of the engine and
the drafter library, so they live above both. Submodules are imported directly.
"""
