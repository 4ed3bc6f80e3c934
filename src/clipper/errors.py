"""The one exception hierarchy of clipper-serve.

Every exception class in the package derives from :class:`ClipperError` (a unit test walks every
module to keep it so). Classes defined beside their only raiser name their module in brackets::

    ClipperError
    ├── ConfigError            invalid settings (bad port, unknown controller, ...)
    │   ├── DocumentError      a desired-state file that cannot be applied [declarative.document]
    │   ├── _Refused           an untrusted file refused at a line and column [untrusted]
    │   ├── ExportRefused      a state the desired-state file cannot express [declarative.export]
    │   └── PortInUse          a port the frontend must bind is taken [runtime.ports]
    ├── RequestError           a client sent something we cannot serve -> an HTTP status
    │   ├── BadInputError      malformed JSON, wrong input type, missing keys (400)
    │   ├── NotFoundError      unknown application or route (404)
    │   ├── PayloadTooLarge    body over the configured limit (413)
    │   ├── QueryRejected      overload answered with 503, not a default [query.prediction]
    │   ├── ParseBusy          every place for large bodies in parse taken (503)
    │   │                      [frontend.parse_pool]
    │   ├── QueryProcessingError  a query the query path refuses (400) [query.prediction]
    │   ├── Misconfigured      a policy its links cannot serve (503) [query.selection]
    │   ├── NoPrediction       feedback for an input no model answered (503) [query.selection]
    │   ├── FeedbackError      feedback that failed while learned from (400) [query.selection]
    │   ├── AnswerFailed       an accepted query whose answer could not be encoded (500)
    │   │                      [query.prediction]
    │   ├── ModelFailed        a model raised, answered as an error (500 / INTERNAL)
    │   │                      [frontend.model_failure]
    │   └── TenantRefused      a request the tenant gate refuses, with header lines [tenants]
    │       ├── KeyRequired    no API key for an application that requires one (401)
    │       ├── UnknownKey     a key no tenant holds (401)
    │       ├── PriorityForbidden  X-Priority above the key's class (403)
    │       ├── BadTenantHeader    a key or priority header that is not one (400)
    │       └── QuotaExceeded  over a tenant's quota (429, Retry-After, RateLimit)
    ├── RegistryError          applications, models, links: duplicate, unknown, incompatible
    │   ├── OperationError     an admin operation refused (400) [frontend.admin_fields]
    │   ├── ApplyError         a step of `clipper apply` refused [declarative.apply]
    │   └── LiveVersionError   deleting a version applications are served by, unforced (409)
    │                          [runtime.control]
    ├── FieldError             an admin body off its route's schema [frontend.admin_fields]
    ├── ArchiveTooLarge        upload over its unpacked size or file limit [archives]
    ├── StoreError             the config store's backend failed; nothing changed (503)
    ├── ModelError             a model raised while predicting (carries its message)
    │   └── ModelOutputError   an output that cannot be served: NaN, not JSON, too large
    ├── OverloadedError        a query shed because it cannot meet its deadline (queue full/slow)
    ├── DeadlineExceeded       a query's deadline passed before its batch could be sent
    ├── ClientGone             every query waiting for an input was abandoned: never evaluated
    ├── ReplicaError           a replica is gone, or answered with a broken frame
    │   └── ModelTooBig        a model over a pool process's whole memory budget
    │                          [container.pool_budget]
    ├── ArtifactUnavailable    a container's artifact fetch stopped, or none to fetch
    │                          [container.fetch]
    ├── _NoAnswer              the frontend did not answer a fetch in time [container.fetch]
    ├── ProtocolError          an HTTP/2 connection error, answered by GOAWAY
    │                          [frontend.grpc.h2_frames]
    ├── HeaderLimitError       an HTTP/2 header block over a limit: GOAWAY ENHANCE_YOUR_CALM
    │                          [frontend.grpc.hpack_blocks]
    ├── _Abort                 a V2 gRPC method's abort(): a trailers-only error
    │                          [frontend.grpc.native]
    └── WireError              a message that does not follow the RPC framing
"""

from __future__ import annotations

__all__ = [
    "BadInputError",
    "ClientGone",
    "ClipperError",
    "ConfigError",
    "DeadlineExceeded",
    "ModelError",
    "ModelOutputError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLarge",
    "RegistryError",
    "ReplicaError",
    "RequestError",
    "StoreError",
    "WireError",
]


class ClipperError(Exception):
    """Root of every error clipper-serve raises on purpose."""


class ConfigError(ClipperError):
    """A setting is invalid; the message names it and what is accepted."""


class RequestError(ClipperError):
    """A client request that cannot be served; maps to an HTTP status."""

    status: int = 400
    error: str = "Bad request"
    # Extra response header lines, each ending in CRLF (429's Retry-After, 401's
    # WWW-Authenticate); built by the raiser, never from request data.
    headers: bytes = b""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, cause={self.cause!r})"


class BadInputError(RequestError):
    status = 400
    error = "Json error"


class NotFoundError(RequestError):
    status = 404
    error = "Not found"


class PayloadTooLarge(RequestError):
    status = 413
    error = "Payload too large"


class RegistryError(ClipperError):
    """An application/model/link operation that the registry refuses."""


class ModelError(ClipperError):
    """The model's own code raised; the message is the model's."""


class ModelOutputError(ModelError):
    """The model returned an output that cannot be served (a NaN or infinity, an object that is
    not JSON, more bytes than the limit); the message says which (:mod:`clipper.rpc.outputs`)."""


class OverloadedError(ClipperError):
    """Shed at once: the query could not have been answered within its SLO."""


class DeadlineExceeded(ClipperError):
    """The query's deadline passed while it waited in its model's queue."""


class ClientGone(ClipperError):
    """Every query waiting for an input was abandoned (its client closed its connection or
    reset its stream): the input is dropped from its model's queue, never evaluated."""


class StoreError(ClipperError):
    """The store's backend failed (cannot open the file, server unreachable, bad record).
    Here, not beside the stores: the client raises it too, and must not import them."""


class ReplicaError(ClipperError):
    """A replica disappeared or misbehaved."""


class WireError(ClipperError):
    """A message that does not follow the RPC framing."""
