"""MLServer custom inference runtime serving one peer-benchmark workload.

``serve.py`` names ``workload_runtime.WorkloadRuntime`` as the model's ``implementation`` and
the workload in ``parameters.extra.workload``. With ``parallel_workers >= 1`` MLServer builds
this class in its main process too, but calls ``load()`` only inside the inference worker, so
the model is built there alone.

MLServer's adaptive batcher merges queued requests along the first axis, so ``predict`` sees
one ``input`` tensor of shape ``[n, d]`` and must answer an ``output`` tensor whose first axis
is ``n`` (the batcher splits it back by each request's row count).
"""

from __future__ import annotations

from typing import Any

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError, ModelNotFound
from mlserver.handlers import custom_handler
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from workloads import Predict, as_batch, make_model

# V2 datatypes as Triton's model configuration names them.
_TRITON_TYPES = {"BOOL": "TYPE_BOOL", "BYTES": "TYPE_STRING"}


class WorkloadRuntime(MLModel):
    """``input`` FP32 ``[n, d]`` -> ``output`` INT64 ``[n, 1]`` (one label per row)."""

    async def load(self) -> bool:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        self._workload = str(extra["workload"])
        self._predict: Predict = make_model(self._workload)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        tensors = [t for t in payload.inputs if t.name == "input"]
        if len(tensors) != 1:
            raise InferenceError("expected exactly one input tensor named 'input'")
        batch = as_batch(NumpyCodec.decode_input(tensors[0]), self._workload)
        labels = [int(c) for c in self._predict(batch)]
        # Built by hand rather than with NumpyCodec.encode_output, which adds the parameter
        # {"content_type": "np"}: Triton's HTTP client (perf_analyzer) takes any output
        # "parameters" for the binary extension and fails looking for "binary_data_size".
        output = ResponseOutput(
            name="output", shape=[len(labels), 1], datatype="INT64", data=labels
        )
        return InferenceResponse(model_name=self.name, model_version=self.version, outputs=[output])

    # perf_analyzer reads a Triton model configuration (GET /v2/models/<m>/config) before it
    # sends anything; MLServer has no such route, so the runtime adds one. Off the hot path.
    @custom_handler(rest_path="/v2/models/{model_name}/config", rest_method="GET")
    async def triton_config(self, model_name: str) -> dict[str, Any]:
        if model_name != self.name:
            raise ModelNotFound(model_name)

        def tensors(metadata: list[Any]) -> list[dict[str, Any]]:
            return [
                {
                    "name": t.name,
                    "data_type": _TRITON_TYPES.get(t.datatype, f"TYPE_{t.datatype}"),
                    "dims": list(t.shape[1:]),  # without the batch axis
                }
                for t in metadata
            ]

        return {
            "name": self.name,
            "platform": "mlserver",
            "max_batch_size": max(self.settings.max_batch_size, 1),
            "input": tensors(self.settings.inputs),
            "output": tensors(self.settings.outputs),
        }
