"""Typed JSON bodies of the calls between worker processes, and their parsers.

``rollout`` (``POST /v1/generate``: the trainer's rollout dispatch -> a rollout worker),
``samples`` (``GET /v1/samples/latest``: a drafter worker -> the trainer) and ``ranks`` (rank 0
-> the follower trainer ranks, through the rendezvous store). Both sides of a call import the
same module, so a body is spelled once. Submodules are imported directly.
"""
