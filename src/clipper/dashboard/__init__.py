"""The live dashboard on the admin port (docs/dashboard.md): a sampler of the frontend's own
metrics and state into fixed rings, a page drawn with plotly.js, and its server-sent events."""

from clipper.dashboard.history import History
from clipper.dashboard.routes import Dashboard
from clipper.dashboard.sampler import Sampler

__all__ = ["Dashboard", "History", "Sampler"]
