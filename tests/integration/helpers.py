"""Test helpers: a tiny HTTP/1.1 client on asyncio streams, and bounded polling.

The frontend runs on the test's own event loop, so the client must never block it: every
request is one ``asyncio.open_connection`` with ``Connection: close`` and a body read by
``Content-Length``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import cloudpickle
import orjson


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    elapsed: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def json(self) -> Any:
        return orjson.loads(self.body)


async def request(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    *,
    headers: dict[str, str] | None = None,
    limit_s: float = 10.0,
) -> Response:
    """One HTTP/1.1 request on a fresh connection; raises TimeoutError after ``limit_s``."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    path = parts.path or "/"
    t0 = time.monotonic()
    async with asyncio.timeout(limit_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
            for name, value in (headers or {}).items():
                head.append(f"{name}: {value}")
            if body is not None:
                head.append(f"Content-Length: {len(body)}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + (body or b""))
            await writer.drain()
            raw_head = await reader.readuntil(b"\r\n\r\n")
            lines = raw_head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            hdrs: dict[str, str] = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    hdrs[name.strip().lower()] = value.strip()
            length = int(hdrs.get("content-length", "0"))
            data = await reader.readexactly(length)
        finally:
            writer.close()
    return Response(status, hdrs, data, time.monotonic() - t0)


async def post_json(url: str, doc: Any, *, limit_s: float = 10.0) -> Response:
    return await request(
        url,
        "POST",
        orjson.dumps(doc),
        headers={"Content-Type": "application/json"},
        limit_s=limit_s,
    )


async def predict(base_url: str, app: str, doc: Any, *, limit_s: float = 10.0) -> Response:
    """POST ``doc`` to ``/<app>/predict``; asserts nothing."""
    return await post_json(f"{base_url}/{app}/predict", doc, limit_s=limit_s)


async def predict_ok(base_url: str, app: str, doc: Any, *, limit_s: float = 10.0) -> Any:
    """POST and return the decoded body, asserting a 200 JSON answer."""
    resp = await predict(base_url, app, doc, limit_s=limit_s)
    assert resp.status == 200, (resp.status, resp.body)
    assert resp.headers["content-type"] == "application/json"
    return resp.json()


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    limit_s: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> None:
    """Poll ``condition`` (sync or async) until true; fail the test after ``limit_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {limit_s} s waiting for {what}")
        await asyncio.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_row_sums(directory: Path) -> str:
    """A cloudpickle file of ``models.row_sums`` (by value: containers do not import the
    tests); returns its path."""
    from tests.integration import models

    path = directory / "sums.pkl"
    cloudpickle.register_pickle_by_value(models)
    try:
        path.write_bytes(cloudpickle.dumps(models.row_sums))
    finally:
        cloudpickle.unregister_pickle_by_value(models)
    return str(path)


async def versioned_client(
    base_url: str,
    app: str,
    k: int,
    *,
    stop: asyncio.Event,
    outcomes: collections.Counter[str],
    versions: collections.deque[int] | None = None,
) -> None:
    """A closed-loop client of a model answering ``{"version", "sum"}`` (models.version_one,
    version_two): sends ``[k, i]`` back to back until ``stop``, counting each answer in
    ``outcomes`` as ``v<version>``, ``default: <why>`` or ``status <code>``, and appending
    each version that answered to ``versions``."""
    i = 0
    while not stop.is_set():
        i += 1
        resp = await predict(base_url, app, {"input": [float(k), float(i)]})
        if resp.status != 200:
            outcomes[f"status {resp.status}"] += 1
            continue
        doc = resp.json()
        if doc["default"]:
            outcomes["default: " + doc["default_explanation"]] += 1
            continue
        assert doc["output"]["sum"] == float(k + i)
        outcomes[f"v{doc['output']['version']}"] += 1
        if versions is not None:
            versions.append(doc["output"]["version"])
