"""A ``ContainerManager`` that lets the original ``clipper_admin`` drive clipper-serve.

::

    from clipper_admin import ClipperConnection
    from clipper.compat.clipper_admin import LocalClipperManager

    conn = ClipperConnection(LocalClipperManager("127.0.0.1:1338", "127.0.0.1:1337"))
    conn.connect()
    conn.register_application("digits", "doubles", "-1.0", 100_000)
    conn.deploy_model("logreg", "1", "doubles", "/path/to/model.pkl", num_replicas=2)
    conn.link_model_to_app("digits", "logreg")

Nothing here runs Docker. The ``image`` argument of ``deploy_model`` is the path (on the
frontend's machine) of a model artifact: a cloudpickle file of a function or of an object with
``predict``, or a directory artifact, as ``clipper deploy`` takes. ``build_model`` and the
``clipper_admin.deployers`` need a Docker daemon and are not supported.

How the calls map onto the admin API (docs/admin-api.md):

* ``deploy_model`` -> ``POST /admin/stage_model``: clipper_admin calls the manager *before* it
  registers the version with ``/admin/add_model``; the frontend keeps the artifact and replica
  count, and that ``add_model`` starts the replicas and answers once they are connected.
* ``set_num_replicas`` / ``stop_models`` / ``stop_all_model_containers`` ->
  ``POST /admin/set_num_replicas`` (0 to stop).
* ``get_num_replicas`` -> ``POST /admin/get_replicas`` (connected replicas).
* ``get_logs`` -> ``POST /admin/get_logs``, written into ``logging_dir``.
* ``start_clipper`` / ``connect`` start nothing: they check that the frontend answers.
  ``stop_all`` leaves the frontend running (stop it with ``clipper stop`` or its owner).

The original ``ClipperConnection`` sends no ``Authorization`` header, so it works only with an
admin API without a token (the default: bound to loopback).
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

try:
    from clipper_admin.container_manager import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        ContainerManager,
    )
    from clipper_admin.exceptions import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        ClipperException,
    )
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "clipper.compat.clipper_admin needs the original clipper_admin package: "
        "pip install 'clipper-serve[clipper-admin-compat]' (or: pip install "
        "clipper-admin==0.4.1 && pip install 'cloudpickle>=3'; clipper-admin pins "
        f"cloudpickle 0.5.3, which cannot be imported on Python 3.8+). Import error: {e}"
    ) from e

__all__ = ["LocalClipperManager"]

log = logging.getLogger("clipper.compat")


def _addr(addr: str) -> str:
    """``host:port`` from ``host:port`` or ``http://host:port[/]``."""
    for scheme in ("http://", "https://"):
        if addr.startswith(scheme):
            addr = addr[len(scheme) :]
    return addr.rstrip("/")


class LocalClipperManager(ContainerManager):  # type: ignore[misc]
    """Model replicas as local processes of a running clipper-serve frontend.

    ``admin_addr`` and ``query_addr`` are ``host:port`` (or ``http://host:port``).
    ``timeout_s`` bounds each admin call; deploying and scaling answer when the replicas are
    connected, which takes as long as the model's start-up."""

    def __init__(
        self,
        admin_addr: str = "127.0.0.1:1338",
        query_addr: str = "127.0.0.1:1337",
        *,
        cluster_name: str = "clipper-serve",
        admin_token: str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.admin_addr = _addr(admin_addr)
        self.query_addr = _addr(query_addr)
        self.cluster_name = cluster_name
        self.cluster_identifier = cluster_name
        self.admin_token = admin_token
        self.timeout_s = timeout_s

    @classmethod
    def for_frontend(cls, clipper: Any, **kwargs: Any) -> LocalClipperManager:
        """The manager for a :class:`clipper.Clipper` started in this process."""
        kwargs.setdefault("admin_token", clipper.config.admin_token)
        return cls(clipper.admin_url, clipper.query_url, **kwargs)

    # -- HTTP ----------------------------------------------------------------------------------
    def _call(self, route: str, doc: dict[str, Any] | None = None) -> tuple[int, bytes]:
        url = f"http://{self.admin_addr}/admin/{route}"
        data = None if doc is None else json.dumps(doc).encode()
        req = urllib.request.Request(url, data=data, method="GET" if doc is None else "POST")
        req.add_header("Content-Type", "application/json")
        if self.admin_token:
            req.add_header("Authorization", f"Bearer {self.admin_token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except (urllib.error.URLError, OSError) as err:
            raise ClipperException(
                f"the clipper-serve admin API at {url} is unreachable: {err}"
            ) from err

    def _post(self, route: str, doc: dict[str, Any]) -> bytes:
        status, body = self._call(route, doc)
        if status != 200:
            raise ClipperException(
                f"/admin/{route} answered {status}: {body.decode('utf-8', 'replace')}"
            )
        return body

    def _check(self) -> None:
        status, body = self._call("ping")
        if status != 200:
            raise ClipperException(
                f"the clipper-serve admin API at {self.admin_addr} answered {status} to "
                f"/admin/ping: {body.decode('utf-8', 'replace')}"
            )

    # -- ContainerManager ----------------------------------------------------------------------
    def start_clipper(self, *args: Any, **kwargs: Any) -> None:
        """The frontend runs already (``clipper start``): check that it answers."""
        self._check()

    def connect(self) -> None:
        self._check()

    def deploy_model(
        self, name: str, version: str, input_type: str, image: str, num_replicas: int = 1
    ) -> None:
        self._post(
            "stage_model",
            {
                "model_name": name,
                "model_version": str(version),
                "input_type": input_type,
                "artifact_path": os.path.abspath(image),
                "num_replicas": num_replicas,
            },
        )

    def get_num_replicas(self, name: str, version: str) -> int:
        body = self._post("get_replicas", {"model_name": name, "model_version": str(version)})
        return len(json.loads(body))

    def set_num_replicas(
        self, name: str, version: str, input_type: str, image: str, num_replicas: int
    ) -> None:
        doc: dict[str, Any] = {
            "model_name": name,
            "model_version": str(version),
            "num_replicas": num_replicas,
        }
        if image and os.path.exists(image):
            doc["artifact_path"] = os.path.abspath(image)
        self._post("set_num_replicas", doc)

    def get_logs(self, logging_dir: str) -> list[str]:
        """Copy the replicas' logs (from the frontend's state directory) into ``logging_dir``;
        returns the paths written."""
        logs = json.loads(self._post("get_logs", {}))
        out_dir = Path(logging_dir).expanduser()
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for entry in logs:
            path = out_dir / Path(entry["file"]).name
            path.write_text(entry["text"])
            paths.append(str(path))
        return paths

    def stop_models(self, models: dict[str, list[str]]) -> None:
        for name, versions in models.items():
            for version in versions:
                self._stop(name, str(version))

    def _stop(self, name: str, version: str) -> None:
        status, body = self._call(
            "set_num_replicas", {"model_name": name, "model_version": version, "num_replicas": 0}
        )
        if status != 200 and b"does not exist" not in body and b"No model" not in body:
            raise ClipperException(
                f"stopping {name}:{version} failed ({status}): {body.decode('utf-8', 'replace')}"
            )

    def stop_all_model_containers(self) -> None:
        for model in json.loads(self._post("get_all_models", {"verbose": True})):
            self._stop(model["model_name"], model["model_version"])

    def stop_all(self, graceful: bool = True) -> None:
        """Stops nothing: the frontend belongs to whoever started it (``clipper start``)."""
        log.info("stop_all: the clipper-serve frontend at %s keeps running", self.admin_addr)

    def get_admin_addr(self) -> str:
        return self.admin_addr

    def get_query_addr(self) -> str:
        return self.query_addr

    def get_metric_addr(self) -> str:
        # Prometheus metrics are served by the query frontend itself, at /metrics.
        return self.query_addr
