"""The Clipper REST request bodies, parsed at the protocol's edge: ``POST /{app}/predict``
(``{"input": …}`` or ``{"input_batch": […]}``, optional ``"version"`` and ``"uid"``) and
``POST /{app}/update`` (``{"input", "label", "uid"?}``), into inputs in their wire form.

Every error says what was wrong and the schema that was expected, in the original's words. The
common doubles body takes the simdjson fast path (:mod:`~clipper.frontend.fast_input`), which
hands anything unusual back to the general path so that errors never depend on the path.
"""

from __future__ import annotations

from typing import Any

import orjson

from clipper.errors import BadInputError
from clipper.frontend import item_scan
from clipper.frontend.fast_input import PRECHECK_BYTES, DoublesReader, ItemCounter
from clipper.inputs import InputType, parse_input
from clipper.query.prediction import too_many_items
from clipper.registry import Application

__all__ = ["PredictParser", "parse_feedback", "parse_uid"]


class PredictParser:
    """``POST /{app}/predict`` bodies → ``(payloads, version, uid)``."""

    __slots__ = ("_counter", "_doubles", "max_items")

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items  # items per request: its parse holds the event loop
        self._doubles = DoublesReader()  # {"input": [numbers]} without Python floats
        self._counter = ItemCounter()  # a large body's input_batch, counted before its parse

    def parse(
        self, app: Application, body: bytes, *, counted: bool = False
    ) -> tuple[list[bytes], str | None, str]:
        """``counted``: :meth:`count` judged the body already (in the parse pool)."""
        itype = app.input_type
        fast = self._doubles.read(body) if itype is InputType.DOUBLES else None
        if fast is not None:
            payload, version, raw_uid = fast
            return [payload], version, parse_uid(raw_uid)
        items, version, uid = self._parse_document(app, body, counted)
        # Only true/false hold an "e" among JSON's non-string tokens besides exponents, and a
        # one-byte search is 20x cheaper than searching for the words; "e": scan types.
        bools = b"e" in body
        return [parse_input(itype, item, may_hold_bools=bools) for item in items], version, uid

    def count(self, app: Application, body: bytes) -> None:
        """The item cap, judged without the GIL (safe in any thread): 413 for an
        ``input_batch`` over it, 400 for a body whose brackets do not balance or that gives
        ``input_batch`` twice."""
        try:
            n = item_scan.batch_items(body)
        except ValueError as e:
            schema = app.input_type.schema()
            raise BadInputError(
                f"Error parsing JSON: {e}. Expected JSON schema: {schema}"
            ) from None
        if n is not None and n > self.max_items:
            raise too_many_items(n, self.max_items, '"input_batch"')

    def _parse_document(
        self, app: Application, body: bytes, counted: bool = False
    ) -> tuple[list[Any], str | None, str]:
        schema = app.input_type.schema()
        if len(body) > PRECHECK_BYTES and not counted:
            # Counted before the parse, which for a million small items holds the loop 0.5 s;
            # any input_batch over the cap is refused, even beside an "input".
            try:
                n = self._counter.batch_items(body)
            except ValueError as e:
                raise BadInputError(
                    f"Error parsing JSON: {e}. Expected JSON schema: {schema}"
                ) from None
            if n is not None and n > self.max_items:
                raise too_many_items(n, self.max_items, '"input_batch"')
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise BadInputError(
                f"Error parsing JSON: {e}. Expected JSON schema: {schema}"
            ) from None
        if not isinstance(doc, dict):
            raise BadInputError(
                "Error parsing JSON: the body must be a JSON object. "
                f"Expected JSON schema: {schema}"
            )
        version = doc.get("version")
        if version is not None and not isinstance(version, str):
            raise BadInputError(
                f'Error parsing JSON: "version" must be a string, got {type(version).__name__}'
            )
        if "input" in doc:
            return [doc["input"]], version, parse_uid(doc.get("uid"))
        batch = doc.get("input_batch")
        if batch is None:
            raise BadInputError(
                "Error parsing JSON: JSON object does not have required keys input or "
                f"input_batch. Expected JSON schema: {schema}"
            )
        if not isinstance(batch, list) or not batch:
            raise BadInputError(
                'Error parsing JSON: "input_batch" must be a non-empty array. '
                f"Expected JSON schema: {schema}"
            )
        if len(batch) > self.max_items:  # before any per-item work
            raise too_many_items(len(batch), self.max_items, '"input_batch"')
        return batch, version, parse_uid(doc.get("uid"))


def parse_feedback(app: Application, body: bytes) -> tuple[bytes, Any, str]:
    """(input payload, label, uid) from ``{"input", "label", "uid"?}``."""
    expected = (
        '{"input": <input>, "label": <JSON value, not null>, "uid": <string or int, optional>}'
    )
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadInputError(f"Error parsing JSON: {e}. Expected JSON schema: {expected}") from None
    if not isinstance(doc, dict) or "input" not in doc or "label" not in doc:
        raise BadInputError(
            "Error parsing JSON: feedback needs keys input and label. "
            f"Expected JSON schema: {expected}"
        )
    if doc["label"] is None:
        # A null label says nothing about any model: learning from it would score every
        # model as wrong.
        raise BadInputError(
            f'Error parsing JSON: "label" is null; a label is the true output for the input. '
            f"Expected JSON schema: {expected}"
        )
    uid = parse_uid(doc.get("uid"))
    return parse_input(app.input_type, doc["input"]), doc["label"], uid


def parse_uid(uid: Any) -> str:
    if uid is None:
        return ""
    if isinstance(uid, bool) or not isinstance(uid, int | str):
        raise BadInputError(
            f'Error parsing JSON: "uid" must be a string or an integer, got {uid!r}'
        )
    return str(uid)
