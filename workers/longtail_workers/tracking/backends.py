"""One class per tracker library: TensorBoard, MLflow, Weights & Biases.

Called only from the sink threads of ``tracking/sink.py`` (never from the training loop), which
retry what raises :class:`TrackerDown` or any error of the library, and drop (with a count and
a log line) what raises :class:`TrackerRefused`. Each backend opens lazily on its first record,
so a tracker that is down at start costs nothing but a buffered record. One tracker run per
RLJob: the MLflow run id and the W&B run id are kept in ``tracking.json`` next to the
checkpoints (:class:`RunIds`), so a resumed trainer and ``longtail run``'s end continue the same
run. The libraries are imported here, inside the methods, so a job without tracking never loads
them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

RUN_IDS_FILE = "tracking.json"
"""The tracker run ids of the job, next to its checkpoints (a pod's persistent volume)."""
WandbMode = Literal["online", "offline"]
MLFLOW_BATCH = 100
"""Parameters per MLflow ``log_batch`` call (its limit in every version)."""
MLFLOW_METRICS_BATCH = 1000
"""Metrics per MLflow ``log_batch`` call (its limit)."""


class TrackerRefused(Exception):
    """The tracker answered and refused the record: sending it again would not help."""


class Backend(Protocol):
    """What a sink drives; every method may block (it runs on the sink's thread)."""

    name: str

    def open(self) -> None: ...
    def log_params(self, params: dict[str, str]) -> None: ...
    def log_metrics(self, steps: list[tuple[int, dict[str, float]]]) -> None:
        """Figures of one or more steps, in step order (a buffer drained after an outage)."""

    def log_artifact(self, path: Path, name: str) -> None:
        """``path`` (a file, or a directory's contents) under the run's ``name/``."""

    def finish(self, outcome: str) -> None: ...


class RunIds:
    """``tracking.json``: backend -> run id, shared by the sink threads."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / RUN_IDS_FILE
        self._lock = threading.Lock()

    def get(self, backend: str) -> str | None:
        with self._lock:
            value = self._read().get(backend)
        return value if isinstance(value, str) else None

    def set(self, backend: str, run_id: str) -> None:
        with self._lock:
            ids = self._read()
            ids[backend] = run_id
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(ids, indent=2) + "\n")
            os.replace(tmp, self.path)

    def _read(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        data = json.loads(self.path.read_text())
        return data if isinstance(data, dict) else {}


class TensorBoardBackend:
    """Event files in ``log_dir`` (torch's ``SummaryWriter``). ``purge_step``: on a resume,
    events from this step on (written after the checkpoint, then rerun) are hidden."""

    name = "tensorboard"

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        self.log_dir, self.purge_step = log_dir, purge_step
        self._writer: Any = None

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(self.log_dir), purge_step=self.purge_step)

    def log_params(self, params: dict[str, str]) -> None:
        table = "| parameter | value |\n|---|---|\n"
        table += "".join(f"| {k} | {v} |\n" for k, v in sorted(params.items()))
        self._writer.add_text("spec", table, 0)
        self._writer.flush()

    def log_metrics(self, steps: list[tuple[int, dict[str, float]]]) -> None:
        for step, figures in steps:
            for key, value in figures.items():
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def log_artifact(self, path: Path, name: str) -> None:
        # TensorBoard keeps no files: a Markdown report is shown as text (tag NAME/FILE), the
        # rest stays on disk next to the event files.
        root = path if path.is_dir() else path.parent
        files = sorted(path.rglob("*.md")) if path.is_dir() else [path]
        for f in (f for f in files if f.suffix == ".md"):
            self._writer.add_text(f"{name}/{f.relative_to(root)}", f.read_text(), 0)
        self._writer.flush()

    def finish(self, outcome: str) -> None:
        self._writer.close()


class MlflowBackend:
    """One MLflow run through ``MlflowClient`` (explicit run id: no global active run)."""

    name = "mlflow"

    def __init__(self, uri: str, experiment: str, run_name: str, ids: RunIds) -> None:
        self.uri, self.experiment, self.run_name, self.ids = uri, experiment, run_name, ids
        self._client: Any = None
        self.run_id: str | None = None

    def open(self) -> None:
        # The sink retries with its own backoff: the client's retries would only delay the
        # failure count and the status; a request may not hang longer than this.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        run_id = self.ids.get(self.name)
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
        else:
            exp = client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp else client.create_experiment(self.experiment)
            run_id = client.create_run(exp_id, run_name=self.run_name).info.run_id
            self.ids.set(self.name, run_id)
        self._client, self.run_id = client, run_id

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        from mlflow.exceptions import MlflowException

        try:
            fn(*args, **kwargs)
        except MlflowException as exc:
            # A 4xx answer (a bad value, a deleted run) would fail again; 429 (rate limit),
            # 5xx and the client's connection errors (500) are retried by the sink.
            status = int(exc.get_http_status_code())  # type: ignore[no-untyped-call]
            if 400 <= status < 500 and status != 429:
                raise TrackerRefused(str(exc)) from exc
            raise

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for i in range(0, len(items), MLFLOW_BATCH):
            self._call(self._client.log_batch, self.run_id, params=items[i : i + MLFLOW_BATCH])

    def log_metrics(self, steps: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for step, figures in steps for k, v in figures.items()]
        for i in range(0, len(metrics), MLFLOW_METRICS_BATCH):
            chunk = metrics[i : i + MLFLOW_METRICS_BATCH]
            self._call(self._client.log_batch, self.run_id, metrics=chunk)

    def log_artifact(self, path: Path, name: str) -> None:
        if path.is_dir():
            self._call(self._client.log_artifacts, self.run_id, str(path), name)
        else:
            self._call(self._client.log_artifact, self.run_id, str(path), name or None)

    def finish(self, outcome: str) -> None:
        status = {"complete": "FINISHED", "stopped": "KILLED"}.get(outcome, "FAILED")
        self._call(self._client.set_terminated, self.run_id, status)


class WandbBackend:
    """One W&B run (``online`` or ``offline`` under ``run_dir/wandb``), resumed by its id."""

    name = "wandb"

    def __init__(self, project: str, entity: str | None, mode: WandbMode, run_dir: Path,
                 run_name: str, ids: RunIds) -> None:  # fmt: skip
        self.project, self.entity, self.mode = project, entity, mode
        self.run_dir, self.run_name, self.ids = run_dir, run_name, ids
        self._run: Any = None

    def open(self) -> None:
        import wandb
        from wandb.sdk.lib.runid import generate_id

        run_id = self.ids.get(self.name)
        if run_id is None:
            run_id = generate_id()
            self.ids.set(self.name, run_id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=self.project, entity=self.entity, mode=self.mode, id=run_id,
            resume="allow", name=self.run_name, dir=str(self.run_dir),
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )  # fmt: skip

    def log_params(self, params: dict[str, str]) -> None:
        self._run.config.update(params, allow_val_change=True)

    def log_metrics(self, steps: list[tuple[int, dict[str, float]]]) -> None:
        for step, figures in steps:
            if step >= self._run.step:  # W&B refuses steps below its last one (a rerun step)
                self._run.log(figures, step=step)

    def log_artifact(self, path: Path, name: str) -> None:
        # Copied under the run's files/NAME/ (W&B names a saved file by its path below
        # base_path), then saved from there: the copy is what the run keeps and syncs.
        root = path if path.is_dir() else path.parent
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        run_files = Path(self._run.dir)
        for f in files:
            dest = run_files / name / f.relative_to(root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
            self._run.save(str(dest), base_path=str(run_files), policy="now")

    def finish(self, outcome: str) -> None:
        self._run.finish(exit_code=0 if outcome == "complete" else 1)
