"""The rollout worker: engine + capture buffer + spot drafter trainer behind one control surface.

``control.RolloutWorker`` holds the engine, the buffer, the spot trainer, the drafter registry
and the role state machine (rollout <-> drafter-train); ``http.ControlServer`` is the thin HTTP
adapter the operator's harvest loop and the local coordinator talk to (``/v1/status``,
``/v1/role``, ``/healthz``, ``/readyz``, ``/metrics``); ``metrics`` exports the worker's state to
Prometheus; ``service`` is the ``longtail worker rollout`` process, which serves that surface
plus ``POST /v1/generate`` on top of ``RolloutWorker.generate``. Submodules are imported
directly (by ``service``, the local launcher and the tests).
"""
