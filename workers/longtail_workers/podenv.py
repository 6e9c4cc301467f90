"""Command-line defaults of a worker that runs in a pod the operator created.

The operator starts every worker as ``longtail worker ROLE --host 0.0.0.0 --port N`` and says
everything else through ``LONGTAIL_*`` environment variables (the contract is documented in
docs/operator.md and built by ``longtail_operator.builders.discovery_env``). ``longtail worker``
calls :func:`pod_args` before it hands the arguments to the role's service: it appends what the
role needs and the command line does not already give, derived from those variables and from the
job's config file. Outside a pod (``LONGTAIL_CONFIG`` unset) nothing changes, so ``longtail run``
and hand-started workers keep their exact command lines.

Pure standard library plus the shared API package, so the CLI can call it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from longtail_api.manifest import validate_file


class PodEnvError(ValueError):
    """A ``LONGTAIL_*`` variable the role needs is missing or malformed."""


def _need(env: Mapping[str, str], name: str, role: str) -> str:
    value = env.get(name, "").strip()
    if not value:
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
        raise PodEnvError(f"LONGTAIL_CONFIG={config}: not one valid RLJob ({errors})")
    return results[0].spec.rollout.replicas


def _trainer_args(argv: Sequence[str], env: Mapping[str, str], config: str) -> list[str]:
    role = "trainer"
    extra: list[str] = []
    if not _has(argv, "--run-dir"):
        extra += ["--run-dir", env.get("LONGTAIL_RUN_DIR", ".")]
    if not _has(argv, "--checkpoint-dir") and env.get("LONGTAIL_CHECKPOINT_DIR"):
        extra += ["--checkpoint-dir", env["LONGTAIL_CHECKPOINT_DIR"]]
    if not _has(argv, "--verifier-url"):
        host = _need(env, "LONGTAIL_VERIFIER_SERVICE", role)
        port = _need(env, "LONGTAIL_VERIFIER_PORT", role)
        extra += ["--verifier-url", f"http://{host}:{port}"]
    if not _has(argv, "--rollout"):
        # Pod i of the rollout role is <job>-rollout-<i>; with hostname + subdomain set by the
        # operator it resolves as <pod>.<headless service> (stable across pod restarts).
        job = _need(env, "LONGTAIL_JOB_NAME", role)
        service = _need(env, "LONGTAIL_ROLLOUT_SERVICE", role)
        port = _need(env, "LONGTAIL_ROLLOUT_PORT", role)
        for i in range(_rollout_replicas(config)):
            extra += ["--rollout", f"{job}-rollout-{i}=http://{job}-rollout-{i}.{service}:{port}"]
    if not _has(argv, "--weights-port") and env.get("LONGTAIL_WEIGHTS_URL"):
        port_of = urlsplit(env["LONGTAIL_WEIGHTS_URL"]).port
        if port_of is None:
            raise PodEnvError(
                f"LONGTAIL_WEIGHTS_URL={env['LONGTAIL_WEIGHTS_URL']!r} has no port; expected "
                "http://HOST:PORT"
            )
        extra += ["--weights-port", str(port_of)]
    if not _has(argv, "--resume") and env.get("LONGTAIL_RESUME", "").lower() == "true":
        extra.append("--resume")  # a restarted trainer pod continues from its last checkpoint
    if not _has(argv, "--drafters") and env.get("LONGTAIL_DRAFTER_DIR", "").strip():
        # The trainer's own registry directory; its --port serves it to the rollout workers.
        extra += ["--drafters", env["LONGTAIL_DRAFTER_DIR"].strip()]
    return extra


def _rollout_args(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    extra: list[str] = []
    if not _has(argv, "--name") and env.get("LONGTAIL_POD_NAME"):
        extra += ["--name", env["LONGTAIL_POD_NAME"]]
    if not _has(argv, "--weights-url"):
        extra += ["--weights-url", _need(env, "LONGTAIL_WEIGHTS_URL", "rollout")]
    extra += _rollout_drafter_args(argv, env)
    return extra


def _rollout_drafter_args(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``--drafters DIR`` (a volume the user shares with the trainer, ``LONGTAIL_DRAFTER_DIR``)
    wins over ``--drafters-url URL`` (the trainer's HTTP exchange, ``LONGTAIL_DRAFTER_URL``, set
    by the operator); nothing when the command line already names either."""
    if _has(argv, "--drafters") or _has(argv, "--drafters-url"):
        return []
    directory = env.get("LONGTAIL_DRAFTER_DIR", "").strip()
    if directory:
        return ["--drafters", directory]
    url = env.get("LONGTAIL_DRAFTER_URL", "").strip()
    if not url:
        return []
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise PodEnvError(
            f"LONGTAIL_DRAFTER_URL={url!r}: expected http://HOST:PORT (the trainer's base URL)"
        )
    return ["--drafters-url", url]


def _drafter_args(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """A dedicated drafter worker: its name, the trainer (step samples and, unless
    ``LONGTAIL_DRAFTER_URL`` names another, the drafter exchange) and the weight server."""
    extra: list[str] = []
    if not _has(argv, "--name") and env.get("LONGTAIL_POD_NAME"):
        extra += ["--name", env["LONGTAIL_POD_NAME"]]
    if not _has(argv, "--trainer-url"):
        extra += ["--trainer-url", _http_url(env, "LONGTAIL_TRAINER_URL", "drafter")]
    if not _has(argv, "--weights-url"):
        extra += ["--weights-url", _http_url(env, "LONGTAIL_WEIGHTS_URL", "drafter")]
    if not _has(argv, "--drafters-url") and env.get("LONGTAIL_DRAFTER_URL", "").strip():
        extra += ["--drafters-url", _http_url(env, "LONGTAIL_DRAFTER_URL", "drafter")]
    return extra


def _http_url(env: Mapping[str, str], name: str, role: str) -> str:
    url = _need(env, name, role)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise PodEnvError(f"{name}={url!r}: expected http://HOST:PORT")
    return url


def pod_args(role: str, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``argv`` plus the arguments a pod's environment implies for ``role`` (see module text)."""
    config = env.get("LONGTAIL_CONFIG", "").strip()
    if not config or role == "verifier":  # the verifier needs nothing beyond --host/--port
        return list(argv)
    extra: list[str] = []
    if not _has(argv, "--job"):
        extra += ["--job", config]
    if role == "trainer":
        extra += _trainer_args(argv, env, config)
    elif role == "rollout":
        extra += _rollout_args(argv, env)
    elif role == "drafter":
        extra += _drafter_args(argv, env)
    return [*argv, *extra]
