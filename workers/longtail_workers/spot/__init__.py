"""Online ("spot") drafter training on rollout workers that idle through the long tail.

The pieces, in data-flow order:

* ``buffer``     captures (tokens, target hidden states, policy version, step) from finished
  rollouts into a bounded, step-tagged buffer; adding never blocks generation;
* ``windows``    cuts captured sequences into ~``window_tokens`` windows and packs several into
  one training row with a block-diagonal causal mask;
* ``trainer``    the preemptible background trainer (start / request_stop / wait_stopped);
* ``publish``    versioned, atomic publishing of drafter versions and the token-weighted merge of
  several workers' candidates at the step boundary;
* ``acceptance`` acceptance length per policy and per drafter version (stats and Prometheus);
* ``export``     writes a drafter in the EAGLE-1 layout serving engines load;
* ``metrics``    the metric specs of this package and of the worker control surface.

The worker control surface that switches a worker between rollout and drafter training lives in
``longtail_workers.rollout``. Submodules are imported directly.
"""
