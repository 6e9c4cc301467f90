"""Command-line defaults of a worker that runs in a pod the operator created.

The operator starts every worker as ``longtail worker ROLE --host 0.0.0.0 --port N`` and says
everything else through the pod's environment, typed once as
:class:`longtail_api.podenv.PodEnv` (the operator writes it with ``to_env``; the contract for
users is documented in docs/operator.md). ``longtail worker`` calls :func:`pod_args` before it
hands the arguments to the role's service: it reads the environment with ``PodEnv.from_env`` and
appends what the role needs and the command line does not already give, derived from it and
from the job's config file. Outside a pod (no config variable) nothing changes, so
``longtail run`` and hand-started workers keep their exact command lines. The trainer also
calls :func:`rollout_workers` at each step start (``trainer/membership.py``): the one naming
rule of the rollout pods.

Pure standard library plus the shared API package, so the CLI can call it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from longtail_api import podenv as names
from longtail_api.manifest import validate_file
from longtail_api.podenv import PodEnv, PodEnvError

__all__ = ["PodEnvError", "pod_args", "rollout_workers"]


def _need(value: str | None, name: str, role: str) -> str:
    if value is None:
        raise PodEnvError(
            f"worker {role}: environment variable {name} is not set; the operator sets it on "
            "every worker pod (docs/operator.md), or pass the matching command-line option"
        )
    return value


def _has(argv: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in argv)


def _rollout_replicas(config: str) -> int:
    results = validate_file(config)
    if len(results) != 1 or results[0].spec is None:
        errors = "; ".join(str(e) for r in results for e in r.errors) or "no RLJob in the file"
        raise PodEnvError(f"{names.CONFIG}={config}: not one valid RLJob ({errors})")
    return results[0].spec.rollout.replicas


def _peer(env: PodEnv, peer: str, role: str) -> tuple[str, int]:
    found = env.peers.get(peer)
    if found is None:
        _need(None, names.service_var(peer), role)
    assert found is not None
    return found.service, found.port


def rollout_workers(env: PodEnv, replicas: int) -> dict[str, str]:
    """Name -> base URL of the job's rollout pods ``0 .. replicas - 1``: the trainer's
    ``--rollout`` list at start, and its membership at each step start when the job's
    ``spec.rollout.replicas`` changes live (``trainer/membership.py``)."""
    # Pod i of the rollout role is <job>-rollout-<i>; with hostname + subdomain set by the
    # operator it resolves as <pod>.<headless service> (stable across pod restarts).
    job = _need(env.job_name, names.JOB_NAME, "trainer")
    service, port = _peer(env, "rollout", "trainer")
    return {
        f"{job}-rollout-{i}": f"http://{job}-rollout-{i}.{service}:{port}" for i in range(replicas)
    }


def _trainer_args(argv: Sequence[str], env: PodEnv, config: str) -> list[str]:
    role = "trainer"
    extra: list[str] = []
    if not _has(argv, "--run-dir"):
        extra += ["--run-dir", env.run_dir or "."]
    if not _has(argv, "--checkpoint-dir") and env.checkpoint_dir:
        extra += ["--checkpoint-dir", env.checkpoint_dir]
    if not _has(argv, "--verifier-url"):
        host, port = _peer(env, "verifier", role)
        extra += ["--verifier-url", f"http://{host}:{port}"]
    if not _has(argv, "--rollout"):
        for name, url in rollout_workers(env, _rollout_replicas(config)).items():
            extra += ["--rollout", f"{name}={url}"]
    if not _has(argv, "--weights-port") and env.weights_url:
        extra += ["--weights-port", str(urlsplit(env.weights_url).port)]  # checked by PodEnv
    if not _has(argv, "--resume") and env.resume:
        extra.append("--resume")  # a restarted trainer pod continues from its last checkpoint
    if not _has(argv, "--drafters") and env.drafter_dir:
        # The trainer's own registry directory; its --port serves it to the rollout workers.
        extra += ["--drafters", env.drafter_dir]
    return extra


def _rollout_args(argv: Sequence[str], env: PodEnv) -> list[str]:
    extra: list[str] = []
    if not _has(argv, "--name") and env.pod_name:
        extra += ["--name", env.pod_name]
    if not _has(argv, "--weights-url"):
        extra += ["--weights-url", _need(env.weights_url, names.WEIGHTS_URL, "rollout")]
    extra += _rollout_drafter_args(argv, env)
    return extra


def _rollout_drafter_args(argv: Sequence[str], env: PodEnv) -> list[str]:
    """``--drafters DIR`` (a volume the user shares with the trainer, ``drafter_dir``) wins
    over ``--drafters-url URL`` (the trainer's HTTP exchange, ``drafter_url``, set by the
    operator); nothing when the command line already names either."""
    if _has(argv, "--drafters") or _has(argv, "--drafters-url"):
        return []
    if env.drafter_dir:
        return ["--drafters", env.drafter_dir]
    return ["--drafters-url", env.drafter_url] if env.drafter_url else []


def _drafter_args(argv: Sequence[str], env: PodEnv) -> list[str]:
    """A dedicated drafter worker: its name, the trainer (step samples and, unless
    ``drafter_url`` names another, the drafter exchange) and the weight server."""
    role = "drafter"
    extra: list[str] = []
    if not _has(argv, "--name") and env.pod_name:
        extra += ["--name", env.pod_name]
    if not _has(argv, "--trainer-url"):
        extra += ["--trainer-url", _need(env.trainer_url, names.TRAINER_URL, role)]
    if not _has(argv, "--weights-url"):
        extra += ["--weights-url", _need(env.weights_url, names.WEIGHTS_URL, role)]
    if not _has(argv, "--drafters-url") and env.drafter_url:
        extra += ["--drafters-url", env.drafter_url]
    return extra


def pod_args(role: str, argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``argv`` plus the arguments a pod's environment implies for ``role`` (see module text)."""
    if not environ.get(names.CONFIG, "").strip() or role == "verifier":
        return list(argv)  # not in a pod; the verifier needs nothing beyond --host/--port
    env = PodEnv.from_env(environ)
    assert env.config is not None
    extra: list[str] = []
    if not _has(argv, "--job"):
        extra += ["--job", env.config]
    if role == "trainer":
        extra += _trainer_args(argv, env, env.config)
    elif role == "rollout":
        extra += _rollout_args(argv, env)
    elif role == "drafter":
        extra += _drafter_args(argv, env)
    return [*argv, *extra]
