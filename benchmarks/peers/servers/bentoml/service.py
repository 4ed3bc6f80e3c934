"""BentoML service for one peer-benchmark workload (loaded by ``bentoml serve``, see server.py).

``POST /predict`` with ``{"input": [d floats]}`` answers ``[<int label>]``: a batchable BentoML
API gets and returns batches, so each request's row is a batch of one and so is its answer.

Bento arguments (``bentoml serve --arg key=value``): ``workload`` (required), ``max_batch_size``
and ``max_latency_ms``.
"""

from typing import Annotated

import bentoml
import numpy as np
import workloads
from bentoml.validators import DType, Shape
from pydantic import BaseModel


class Args(BaseModel):
    workload: str
    max_batch_size: int = 64
    max_latency_ms: int = 1000


ARGS = bentoml.use_arguments(Args)
# The declared shape (1, d) makes each request's row a batch of one for the adaptive batcher,
# which counts batch sizes along dimension 0 and concatenates the rows into an (n, d) array.
Row = Annotated[np.ndarray, Shape((1, workloads.INPUT_SIZE[ARGS.workload])), DType("float32")]


@bentoml.service(
    name=f"peer-{ARGS.workload}",
    workers=1,  # one model process (the machine has two cores; see systems/bentoml.py)
    threads=1,  # the sync API runs in one worker thread; the batcher sends one batch at a time
    logging={"access": {"enabled": False}},  # no log line per request
)
class WorkloadService:
    def __init__(self) -> None:
        self.model = workloads.make_model(ARGS.workload)

    @bentoml.api(
        route="/predict",
        batchable=True,
        batch_dim=0,
        max_batch_size=ARGS.max_batch_size,
        max_latency_ms=ARGS.max_latency_ms,
    )
    def predict(self, input: Row) -> list[int]:
        return self.model(input)
