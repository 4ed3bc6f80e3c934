import base64
import struct

import orjson
import pytest

from clipper.errors import BadInputError
from clipper.inputs import InputType, parse_input


def test_doubles_accept_integer_literals_and_pack_little_endian() -> None:
    assert parse_input(InputType.DOUBLES, [1, 2.5]) == struct.pack("<2d", 1.0, 2.5)


def test_floats_and_ints_pack_to_their_widths() -> None:
    assert parse_input(InputType.FLOATS, [1, 0.5]) == struct.pack("<2f", 1.0, 0.5)
    assert parse_input(InputType.INTS, [1, -2]) == struct.pack("<2i", 1, -2)


@pytest.mark.parametrize(
    ("t", "value", "fragment"),
    [
        (InputType.DOUBLES, "x", "must be an array of numbers, got a string"),
        (InputType.DOUBLES, [1, "a"], "array element a string is not of type numbers"),
        (InputType.DOUBLES, [[1.0]], "array element an array"),
        (InputType.DOUBLES, [], "input array is empty"),
        (InputType.INTS, [1.5], "number 1.5 is not of type integers"),
        (InputType.INTS, [2**40], "out of range"),
        (InputType.FLOATS, [1e300], "out of range"),
        (InputType.STRINGS, 3, "must be a string, got number 3"),
        (InputType.BYTES, "***", "not valid base64"),
        (InputType.BYTES, [1], "must be a base64 string"),
    ],
)
def test_bad_inputs_say_what_was_wrong_and_what_was_expected(
    t: InputType, value: object, fragment: str
) -> None:
    with pytest.raises(BadInputError) as info:
        parse_input(t, value)
    assert fragment in info.value.cause
    assert f"Expected JSON schema for input type {t.readable}" in info.value.cause


def test_strings_bytes_and_json() -> None:
    assert parse_input(InputType.STRINGS, "héllo") == "héllo".encode()
    assert parse_input(InputType.BYTES, base64.b64encode(b"\x00\x01").decode()) == b"\x00\x01"
    # json is canonical: key order does not make two equal inputs different cache keys
    a = parse_input(InputType.JSON, {"b": 1, "a": [1, 2]})
    b = parse_input(InputType.JSON, {"a": [1, 2], "b": 1})
    assert a == b
    assert orjson.loads(a) == {"a": [1, 2], "b": 1}


@pytest.mark.parametrize(
    ("name", "expected"),
    [("d", InputType.DOUBLES), ("Ints", InputType.INTS), ("strs", InputType.STRINGS),
     ("json", InputType.JSON), ("byte", InputType.BYTES)],
)  # fmt: skip
def test_input_type_aliases(name: str, expected: InputType) -> None:
    assert InputType.parse(name) is expected


def test_unknown_input_type_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="expected one of bytes, integers"):
        InputType.parse("tensor")


def test_rpc_codes_match_the_original() -> None:
    codes = {t.readable: t.code for t in InputType}
    assert codes == {"bytes": 0, "integers": 1, "floats": 2, "doubles": 3, "strings": 4, "json": 4}
