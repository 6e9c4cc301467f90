"""The GRPO trainer's pieces: the maths of the policy update and one optimiser step.

``grpo`` (group advantages, the clipped token-level loss, per-token log-probs under the
policy), ``batch`` (the tensors of one update and their split into micro-batches) and ``optim``
(AdamW and :func:`~longtail_workers.trainer.optim.train_step`). Submodules are imported
directly.
"""
