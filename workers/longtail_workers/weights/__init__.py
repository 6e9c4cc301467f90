"""Policy weight sync: the trainer publishes versioned weights, rollout workers load them.

``sync`` (the interface, the error types and the all-or-nothing load), ``checksum`` (canonical
serialisation and its sha256), ``http_sync`` (HTTP pull in pieces from the trainer, the default;
``pieces``, ``store``) and ``broadcast`` / ``broadcast_source`` (buckets broadcast on a group of
their own per attempt, ``membership``, ``buckets``). Submodules are imported directly.
"""
