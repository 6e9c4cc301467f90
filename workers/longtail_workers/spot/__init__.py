"""Online ("spot") drafter training on rollout workers that idle through the long tail.

The pieces, in data-flow order:

* ``buffer``     captures (tokens, target hidden states, policy version, step) from finished
  rollouts into a bounded, step-tagged buffer; adding never blocks generation;
* ``windows``    cuts captured sequences into ~``window_tokens`` windows and packs several into
  one training row with a block-diagonal causal mask;
* ``trainer``    the preemptible background trainer (start / request_stop / wait_stopped);
* ``sequences``  windows trained on given answers, for the roles that do not generate;
* ``acceptance`` acceptance length per policy and per drafter version (stats and Prometheus).

Drafter versions, their exchange, merge, vetting and export live with the model in
``longtail_workers.drafter``.

The worker control surface that switches a worker between rollout and drafter training lives in
``longtail_workers.rollout``. Submodules are imported directly.
"""
