"""TorchServe custom handler serving one peer-benchmark workload.

``serve.py`` archives this file (``torch-model-archiver --handler``) with a model-config.yaml
whose ``handler: {workload: ...}`` section names the workload; TorchServe hands that file to
the handler as ``context.model_yaml_config``. The module defines exactly one class, which
TorchServe instantiates in its backend worker process and calls ``initialize`` on once.

Each request is ``POST /predictions/<model>`` with the JSON body ``{"input": [d floats]}``;
the frontend's batcher passes up to ``batch_size`` of them to ``handle`` at once, and each
gets ``{"output": label}`` back. A request with an empty body (``GET /predictions/<model>``)
is the readiness probe and gets ``{"ready": 1}``.
"""

from __future__ import annotations

import json
from typing import Any

from workloads import Predict, as_batch, make_model


def _body(request: dict[str, Any]) -> Any:
    """The request's JSON body (the worker has usually decoded it); None when it is empty."""
    body = request.get("body", request.get("data"))
    if isinstance(body, bytes | bytearray):
        return json.loads(body) if body.strip() else None
    return body


def _row(body: Any) -> Any:
    if not isinstance(body, dict) or "input" not in body:
        raise ValueError('expected a JSON body {"input": [floats]}')
    return body["input"]


class WorkloadHandler:
    """A plain handler (no BaseHandler): its ``handle`` sees the raw batch, no torch model file."""

    def __init__(self) -> None:
        self._workload = ""
        self._predict: Predict | None = None

    def initialize(self, context: Any) -> None:
        config = (context.model_yaml_config or {}).get("handler") or {}
        self._workload = str(config["workload"])
        self._predict = make_model(self._workload)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[dict[str, int]]:
        del context  # nothing per request to read or set
        if self._predict is None:
            raise RuntimeError("handler not initialised")
        bodies = [_body(r) for r in data]
        # An empty body is a readiness probe (GET /predictions/<model>): TorchServe's /ping
        # says Healthy as soon as the worker process runs, before the model has loaded, but
        # only a loaded handler can answer this.
        rows = [_row(b) for b in bodies if b is not None]
        labels = iter(self._predict(as_batch(rows, self._workload)) if rows else [])
        return [{"ready": 1} if b is None else {"output": int(next(labels))} for b in bodies]
