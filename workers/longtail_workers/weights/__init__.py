"""Policy weight sync: the trainer publishes versioned weights, rollout workers load them.

``sync`` (the interface, the error types and the all-or-nothing load), ``checksum`` (canonical
serialisation and its sha256), ``http_sync`` (HTTP pull from the trainer, the default) and
``dist_sync`` (torch.distributed broadcast). Submodules are imported directly.
"""
