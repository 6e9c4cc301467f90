"""Policy weight sync: the trainer publishes versioned weights, rollout workers load them.

``sync`` (the interface, the error types and the all-or-nothing load), ``store`` (the
trainer's publisher: the versions kept and the deliveries attached to them), ``plan`` (which
transport a job uses, decided once for the trainer, the rollout workers and local mode),
``records`` (every weight-sync record that crosses processes, through the wire codec),
``checksum`` (canonical serialisation and its sha256), ``http_sync`` (the HTTP delivery and
its client: pull in pieces, the default; ``pieces``) and ``broadcast`` / ``broadcast_source``
(the broadcast delivery: buckets on a group of their own per attempt, ``membership``,
``buckets``). Submodules are imported directly.
"""
