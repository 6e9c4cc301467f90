"""Typed JSON bodies of the calls between worker processes, and their parsers.

``rollout`` (``POST /v1/generate``: the trainer's rollout dispatch -> a rollout worker) and
``samples`` (``GET /v1/samples/latest``: a drafter worker -> the trainer). Both sides of a call
import the same module, so a body is spelled once. Submodules are imported directly.
"""
