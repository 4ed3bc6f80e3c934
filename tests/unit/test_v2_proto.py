"""Our ``inference.proto`` against the real protocol: every message, field, enum value and
method we define must exist in tritonclient's descriptors with the same number and type, or
real clients would read our answers wrong."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from clipper.frontend.grpc import inference_pb2 as ours

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tritonclient") is None
    or importlib.util.find_spec("tritonclient.grpc") is None,
    reason="pip install 'tritonclient[grpc]' for the reference descriptors",
)


def _theirs() -> dict[str, Any]:
    from tritonclient.grpc import model_config_pb2, service_pb2

    found: dict[str, Any] = {}

    def walk(d: Any) -> None:
        found[d.full_name] = d
        for nested in d.nested_types:
            walk(nested)
        for e in d.enum_types:
            found[e.full_name] = e

    for module in (service_pb2, model_config_pb2):
        for d in module.DESCRIPTOR.message_types_by_name.values():
            walk(d)
        for e in module.DESCRIPTOR.enum_types_by_name.values():
            found[e.full_name] = e
    return found


def _ours() -> list[Any]:
    out: list[Any] = []

    def walk(d: Any) -> None:
        if d.GetOptions().map_entry:
            return
        out.append(d)
        for nested in d.nested_types:
            walk(nested)

    for d in ours.DESCRIPTOR.message_types_by_name.values():
        walk(d)
    return out


def test_messages_and_fields_match_the_protocol() -> None:
    theirs = _theirs()
    messages = _ours()
    assert len(messages) > 20
    for d in messages:
        assert d.full_name in theirs, d.full_name
        ref = theirs[d.full_name]
        for f in d.fields:
            assert f.name in ref.fields_by_name, f"{d.full_name}.{f.name}"
            rf = ref.fields_by_name[f.name]
            where = f"{d.full_name}.{f.name}"
            assert (f.number, f.type, f.is_repeated) == (rf.number, rf.type, rf.is_repeated), where
            if f.message_type is not None:
                assert f.message_type.full_name == rf.message_type.full_name, where


def test_enum_values_match_the_protocol() -> None:
    theirs = _theirs()
    for e in ours.DESCRIPTOR.enum_types_by_name.values():
        ref = theirs[e.full_name]
        assert {v.name: v.number for v in e.values} == {v.name: v.number for v in ref.values}


def test_methods_match_the_protocol() -> None:
    from tritonclient.grpc import service_pb2

    service = ours.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ref = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == ref.full_name == "inference.GRPCInferenceService"
    for m in service.methods:
        r = ref.methods_by_name[m.name]
        assert m.input_type.full_name == r.input_type.full_name
        assert m.output_type.full_name == r.output_type.full_name
