"""Online ("spot") drafter training on workers that idle through the long tail.

The pieces, in data-flow order:

* ``buffer``     captures (tokens, target hidden states, policy version, step) from finished
  rollouts into a bounded, step-tagged buffer; adding never blocks generation;
* ``sequences``  captures the same from given answers (hidden states recomputed) for the roles
  that do not generate: the trainer's own drafter training and the dedicated drafter worker;
* ``windows``    cuts captured sequences into ~``window_tokens`` windows and packs several into
  one training row with a block-diagonal causal mask;
* ``trainer``    the preemptible background trainer (start / request_stop / wait_stopped) and
  its quality gate against the version a window started from;
* ``cycle``      one drafter-train window's sync, gate and submission, the same for every
  harvested worker, and the role state machine's shared pieces (errors, ``PUT /v1/role``);
* ``harvested``  the harvested worker's role state machine (own role <-> ``drafter-train``),
  composed by the rollout worker (``rollout/control.py``) and the trainer
  (``trainer/drafter_window.py``);
* ``acceptance`` acceptance length per policy and per drafter version (stats and Prometheus).

Drafter versions, their exchange, merge, vetting and export live with the model in
``longtail_workers.drafter``. Only the harvest loop switches a worker's role (``PUT /v1/role``
on the rollout worker's and the trainer's HTTP surfaces). Submodules are imported directly.
"""
