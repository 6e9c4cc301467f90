"""The EAGLE-style drafter: one definition shared by the rollout engine and the drafter trainers.

``model`` (the module), ``pairs`` (the training-pair convention the engine's draft step also
follows), ``loss`` (TLT's loss), ``checkpoint`` (save/load of the trainable weights) and ``fit``
(offline fitting from engine rollouts). Submodules are imported directly.
"""
