"""A Python client for a running clipper-serve: the admin API and the query API.

::

    from clipper import Client
    c = Client()                                   # http://127.0.0.1:1338 and :1337
    c.register_application("digits", "doubles", default_output="-1", latency_slo_micros=20_000)
    c.deploy_model("logreg", "1", estimator, input_type="doubles")   # any supported framework
    c.link_model_to_app("digits", "logreg")
    c.predict("digits", [0.0] * 64)
    c.set_model_version("logreg", "1")             # rollback = set an older version

Errors are :mod:`clipper.errors` exceptions carrying the server's message: a refused admin
operation is a :class:`RegistryError`, a refused query a :class:`RequestError` (with
``.status``), an unreachable server a :class:`ClipperError`.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from clipper.config import BatchingConfig
from clipper.errors import ClipperError, ConfigError, RegistryError, RequestError, StoreError

__all__ = ["Client"]


class Client:
    def __init__(
        self,
        admin_url: str = "http://127.0.0.1:1338",
        query_url: str = "http://127.0.0.1:1337",
        *,
        token: str | None = None,
        timeout_s: float = 120.0,
        api_key: str | None = None,
        priority: str | None = None,
    ) -> None:
        """``token``: the admin API's; ``api_key``: a tenant's key for queries (sent as
        ``X-Api-Key``), and ``priority`` the class they ask for (``X-Priority``, which can
        only lower the key's): docs/tenants.md."""
        self.admin_url = admin_url.rstrip("/")
        self.query_url = query_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.priority = priority

    # -- transport ---------------------------------------------------------------------------
    def _call(
        self,
        url: str,
        body: bytes | None,
        *,
        headers: dict[str, str] | None = None,
        method: str = "POST",
        query: bool = False,
    ) -> tuple[int, bytes]:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if query:  # the query port reads tenants' keys, never the admin token
            if self.api_key is not None:
                hdrs["X-Api-Key"] = self.api_key
            if self.priority is not None:
                hdrs["X-Priority"] = self.priority
        elif self.token is not None:
            hdrs["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=body, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except urllib.error.URLError as e:
            raise ClipperError(f"cannot reach clipper-serve at {url}: {e.reason}") from None
        except TimeoutError:
            raise ClipperError(f"no answer from {url} within {self.timeout_s} s") from None

    def admin(self, route: str, doc: dict[str, Any] | None = None) -> Any:
        """POST ``/admin/<route>``; the decoded JSON answer, or the text of a plain one."""
        status, data = self._call(f"{self.admin_url}/admin/{route}", orjson.dumps(doc or {}))
        return self._admin_answer(status, data)

    @staticmethod
    def _admin_answer(status: int, data: bytes) -> Any:
        text = data.decode("utf-8", "replace")
        if status == 401:
            raise ClipperError(f"the admin API refused the token: {text}")
        if status >= 400:
            try:
                doc = orjson.loads(data)
                text = doc.get("cause") or doc.get("error") or text
            except (orjson.JSONDecodeError, AttributeError):
                pass
            if status == 503:
                # The store refused the change (nothing was changed) or the frontend is
                # stopping: worth a retry, unlike a refused operation.
                raise StoreError(text)
            raise RegistryError(text)
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return text

    # -- applications ------------------------------------------------------------------------
    def register_application(
        self,
        name: str,
        input_type: str,
        default_output: str,
        latency_slo_micros: int,
        *,
        cache: bool = True,
        overload: str = "default",
        on_model_error: str = "auto",
        **selection: Any,
    ) -> None:
        """``selection``: ``policy`` (single, exp3, exp4, epsilon_greedy, ucb1, thompson,
        ab_split), ``policy_params``, ``min_confidence``, ``loss``, ``loss_scale``,
        ``online_learning`` (docs/selection.md); ``pipeline``: stages instead of linked
        models (docs/pipelines.md)."""
        self.admin(
            "add_app",
            {
                "name": name,
                "input_type": input_type,
                "default_output": default_output,
                "latency_slo_micros": latency_slo_micros,
                "cache": cache,
                "overload": overload,
                **({"on_model_error": on_model_error} if on_model_error != "auto" else {}),
                **selection,
            },
        )

    def update_application(self, name: str, **changes: Any) -> None:
        """Change ``latency_slo_micros``, ``default_output``, ``cache``, ``overload`` or the
        selection settings (``policy``, ``policy_params``, ``min_confidence``, ...)."""
        self.admin("update_app", {"name": name, **changes})

    def set_pipeline(self, name: str, pipeline: dict[str, Any] | None) -> None:
        """Describe application ``name``'s stages (None: a plain application again); see
        docs/pipelines.md. Refused with the problem named, and nothing changed, when the
        description does not hold."""
        self.admin("update_app", {"name": name, "pipeline": pipeline})

    def delete_application(self, name: str) -> None:
        self.admin("delete_app", {"name": name})

    def get_application(self, name: str) -> dict[str, Any] | None:
        doc = self.admin("get_application", {"name": name})
        return doc or None

    def list_applications(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.admin("get_all_applications", {"verbose": True})
        return result

    # -- models ------------------------------------------------------------------------------
    def deploy_model(
        self,
        name: str,
        version: str,
        model: Any = None,
        *,
        input_type: str,
        num_replicas: int = 1,
        batching: BatchingConfig | None = None,
        framework: str | None = None,
        artifact: str | Path | None = None,
        source_sha256: str | None = None,
        input_size: int | None = None,
        labels: Sequence[str] = (),
        pooled: bool = False,
    ) -> dict[str, Any]:
        """Deploy ``model`` (a function, an object with ``predict``, a scikit-learn estimator,
        a PyTorch module, an ONNX file, an XGBoost or LightGBM model), or an artifact already
        on disk; returns once its replicas are ready and traffic has switched to it.
        ``source_sha256``: the digest of the file it was made from, which the frontend keeps
        for ``clipper apply`` to recognise (see docs/cli.md); ``labels``: the version's labels;
        ``pooled``: served from a pool process, loaded on demand (docs/density.md). Before
        anything is sent the model is checked against ``input_type`` and ``input_size``
        (values per input, when known) and smoke-predicted (:func:`clipper.deployers.check`):
        a model that cannot serve them is refused with a ConfigError of one line."""
        if (model is None) == (artifact is None):
            raise ClipperError("deploy_model needs exactly one of model= or artifact=")
        # Only clients that deploy pay the import.
        from clipper.deployers import MANIFEST, package, verify

        with tempfile.TemporaryDirectory(prefix="clipper-client-") as tmp:
            path = (
                Path(artifact)
                if artifact is not None
                else package(model, Path(tmp) / "artifact", framework=framework)
            )
            if path.is_dir() and (path / MANIFEST).is_file():
                try:
                    verify(path, input_type=input_type, input_size=input_size)
                except ConfigError as e:
                    raise ConfigError(f"{name}:{version} refused: {e}") from e
            body = _archive(path)
        query = {
            "name": name,
            "version": version,
            "input_type": input_type,
            "num_replicas": str(num_replicas),
        }
        if batching is not None:
            query["batching"] = orjson.dumps(batching.to_dict()).decode()
        if source_sha256 is not None:
            query["source_sha256"] = source_sha256
        if labels:
            query["labels"] = orjson.dumps(list(labels)).decode()
        if pooled:
            query["pooled"] = "true"
        url = f"{self.admin_url}/admin/upload_model?{urllib.parse.urlencode(query)}"
        status, data = self._call(url, body, headers={"Content-Type": "application/gzip"})
        answer = self._admin_answer(status, data)
        return answer if isinstance(answer, dict) else {"message": answer}

    def download_artifact(self, name: str, version: str) -> bytes:
        """A model version's artifact as the frontend runs it: a gzipped tar (a single
        pickled model is ``model.pkl`` in it)."""
        doc = {"model_name": name, "model_version": version}
        status, data = self._call(f"{self.admin_url}/admin/get_artifact", orjson.dumps(doc))
        if status != 200:
            self._admin_answer(status, data)  # raises with the server's message
        return data

    def link_model_to_app(self, app_name: str, model_name: str) -> None:
        self.admin("add_model_links", {"app_name": app_name, "model_names": [model_name]})

    def unlink_model_from_app(self, app_name: str, model_name: str) -> None:
        self.admin("delete_model_links", {"app_name": app_name, "model_names": [model_name]})

    def set_model_version(self, name: str, version: str) -> None:
        """Switch traffic to ``version``; an older one is a rollback."""
        self.admin("set_model_version", {"model_name": name, "model_version": version})

    def set_num_replicas(self, name: str, num_replicas: int, version: str | None = None) -> None:
        doc: dict[str, Any] = {"model_name": name, "num_replicas": num_replicas}
        if version is not None:
            doc["model_version"] = version
        self.admin("set_num_replicas", doc)

    def set_traffic_split(
        self, name: str, weights: Mapping[str, float] | None, *, sticky: bool = False
    ) -> dict[str, Any]:
        """Split ``name``'s unpinned queries between versions (``{"1": 95, "2": 5}``; None
        removes the split); returns the traffic view once the versions are ready."""
        view: dict[str, Any] = self.admin(
            "set_traffic_split", {"model_name": name, "split": weights, "sticky": sticky}
        )
        return view

    def set_shadow(self, name: str, version: str | None, share: float = 1.0) -> dict[str, Any]:
        """Copy ``share`` of ``name``'s queries to ``version`` (None: no shadow)."""
        view: dict[str, Any] = self.admin(
            "set_shadow", {"model_name": name, "version": version, "share": share}
        )
        return view

    def get_traffic(self, name: str) -> dict[str, Any]:
        """The model's split and shadow, with per-version counts and shadow agreement."""
        view: dict[str, Any] = self.admin("get_traffic", {"model_name": name})
        return view

    def set_autoscale(
        self, name: str, version: str | None = None, **settings: Any
    ) -> dict[str, Any]:
        """Scale ``name`` (its current version, or ``version``) to its SLO: ``min_replicas``,
        ``max_replicas``, ``target_utilization``, ``up_window_s``, ``down_window_s``,
        ``interval_s``, ``shed_threshold``, ``scale_to_zero_after_s``, ``max_held_queries``,
        ``enabled`` (docs/autoscaling.md; ``min_replicas`` 0: scale to zero); settings not
        given keep their values. Returns the version's autoscaling view."""
        doc: dict[str, Any] = {"model_name": name, **settings}
        if version is not None:
            doc["model_version"] = version
        view: dict[str, Any] = self.admin("set_autoscale", doc)["autoscale"]
        return view

    # -- tenants (docs/tenants.md) -------------------------------------------------------------
    def add_tenant(
        self,
        name: str,
        *,
        priority: str = "standard",
        quotas: dict[str, dict[str, float]] | None = None,
    ) -> dict[str, Any]:
        """A tenant of class ``priority`` (critical, standard, sheddable) with ``quotas``:
        ``{"*" | application: {"rate": queries a second, "burst": n}}``."""
        doc: dict[str, Any] = {"name": name, "priority": priority, "quotas": quotas or {}}
        view: dict[str, Any] = self.admin("add_tenant", doc)
        return view

    def update_tenant(self, name: str, **changes: Any) -> dict[str, Any]:
        """Change ``priority`` or ``quotas`` (which replace the tenant's)."""
        view: dict[str, Any] = self.admin("update_tenant", {"name": name, **changes})
        return view

    def delete_tenant(self, name: str) -> None:
        self.admin("delete_tenant", {"name": name})

    def list_tenants(self) -> list[dict[str, Any]]:
        """Every tenant with its class, quotas and key ids (never the keys)."""
        result: list[dict[str, Any]] = self.admin("get_tenants", {})
        return result

    def create_key(self, tenant: str, *, priority: str | None = None) -> dict[str, Any]:
        """A new key for ``tenant``: the answer's ``key`` is the only time it is shown."""
        doc: dict[str, Any] = {"tenant": tenant}
        if priority is not None:
            doc["priority"] = priority
        made: dict[str, Any] = self.admin("create_key", doc)
        return made

    def delete_key(self, tenant: str, key_id: str) -> None:
        self.admin("delete_key", {"tenant": tenant, "key_id": key_id})

    def list_models(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.admin("get_all_models", {"verbose": True})
        return result

    def list_replicas(self, name: str | None = None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.admin(
            "get_replicas", {"model_name": name} if name else {}
        )
        return result

    def delete_model_version(self, name: str, version: str, *, force: bool = False) -> None:
        """Delete a version. The current version of a model linked to an application is
        refused (409, a :class:`RegistryError` saying why) unless ``force``."""
        doc = {"model_name": name, "model_version": version, "force": force}
        self.admin("delete_versioned_model", doc)

    # -- queries -----------------------------------------------------------------------------
    def predict(
        self, app: str, input: Any, *, version: str | None = None, uid: str | int | None = None
    ) -> dict[str, Any]:
        doc: dict[str, Any] = {"input": input}
        if version is not None:
            doc["version"] = version
        if uid is not None:
            doc["uid"] = uid
        answer: dict[str, Any] = self._query(f"{app}/predict", doc)
        return answer

    def predict_batch(self, app: str, inputs: Sequence[Any]) -> list[dict[str, Any]]:
        answer = self._query(f"{app}/predict", {"input_batch": list(inputs)})
        # one input comes back as a bare answer, as in the original
        predictions: list[dict[str, Any]] = answer.get("batch_predictions", [answer])
        return predictions

    def feedback(self, app: str, input: Any, label: Any, *, uid: str | int | None = None) -> None:
        doc: dict[str, Any] = {"input": input, "label": label}
        if uid is not None:
            doc["uid"] = uid
        self._query(f"{app}/update", doc, decode=False)

    def _query(self, route: str, doc: dict[str, Any], *, decode: bool = True) -> Any:
        status, data = self._call(f"{self.query_url}/{route}", orjson.dumps(doc), query=True)
        if status >= 400:
            try:
                cause = orjson.loads(data).get("cause", data.decode())
            except (orjson.JSONDecodeError, AttributeError):
                cause = data.decode("utf-8", "replace")
            err = RequestError(cause)
            err.status = status
            raise err
        return orjson.loads(data) if decode else data


def _archive(path: Path) -> bytes:
    """A gzipped tar of the artifact (a directory, or one file as ``model.pkl``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if path.is_dir():
            for item in sorted(path.rglob("*")):
                tar.add(item, arcname=str(item.relative_to(path)), recursive=False)
        else:
            tar.add(path, arcname="model.pkl")
    return buf.getvalue()
