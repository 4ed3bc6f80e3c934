"""Shared helpers of the experiments: the digits data, markdown tables, and the plots.

The scripts run as ``python experiments/<name>.py``, so this module is imported as ``common``.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (1797 images, 64 features in 0..16, labels 0..9)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)


def split(y: np.ndarray, sizes: Sequence[int], seed: int) -> list[np.ndarray]:
    """Disjoint stratified index sets of the given sizes; the rest of the data comes last."""
    from sklearn.model_selection import train_test_split

    rest = np.arange(len(y))
    parts: list[np.ndarray] = []
    for i, n in enumerate(sizes):
        part, rest = train_test_split(
            rest, train_size=n, random_state=seed * 1000 + i, stratify=y[rest]
        )
        parts.append(np.asarray(part))
    parts.append(np.asarray(rest))
    return parts


def as_labels(pred: np.ndarray) -> list[int]:
    """Predictions as plain ints (what a container would send as JSON)."""
    return [int(v) for v in pred]


def pct(x: float, digits: int = 1) -> str:
    return f"{100.0 * x:.{digits}f}%"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; cells are written with ``str``."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None (with a hint) when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        print("(matplotlib is not installed: no plot; `pip install matplotlib`)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, name: str) -> Path:
    """Write ``fig`` to ``experiments/results/<name>`` and close it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def start_child(cmd: list[str], log_path: Path, limit_s: float = 150.0) -> tuple[Any, str]:
    """Start a server script (``--serve``) and wait for its ``ready <url>`` line on stdout;
    its stderr goes to ``log_path``. Returns the process and the URL."""
    with open(log_path, "w") as err:  # the child keeps its own copy
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    assert server.stdout is not None
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if line.startswith("ready "):
            return server, line.split()[1]
        if not line and server.poll() is not None:
            break
    server.kill()
    tail = log_path.read_text()[-3000:]
    raise RuntimeError(f"the server did not start; its log ends with:\n{tail}")


# --- experiments that run the real server in a child process --------------------------------


class Connection:
    """One HTTP/1.1 keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> bytes:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in raw.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def stop_server(server: subprocess.Popen[str]) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
