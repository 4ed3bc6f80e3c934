"""Fixtures shared by the integration tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.integration.redis_server import REDIS_SERVER, start_redis, stop_redis


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A fresh redis-server's store URL, with a prefix of its own (skips without redis)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    pytest.importorskip("redis", reason="pip install 'redis>=5'")
    proc, port = start_redis()
    yield f"redis://127.0.0.1:{port}/0?prefix=t{uuid.uuid4().hex[:8]}"
    stop_redis(proc)
