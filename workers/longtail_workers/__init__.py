"""Longtail's workers: the processes that do the GPU (or CPU) work of an RLJob.

One package, several roles selected at start-up (``longtail worker ROLE``): rollout (adaptive
speculative-decoding engine plus spot drafter trainer), verifier (rewards), trainer (GRPO and
the step driver). Workers never talk to the Kubernetes API and never import kopf or the
operator; they expose HTTP (health, status, control, Prometheus ``/metrics``) instead.
"""
