"""The named-choice tables: each Literal, factory, CLI option and message derives from one table."""

import argparse
import typing

import pytest

from clipper import choices
from clipper.choices import (
    CACHE_POLICIES,
    CONTROLLERS,
    INPUT_TYPES,
    LOSSES,
    OVERLOAD,
    POLICIES,
    Choice,
    Option,
)
from clipper.errors import ConfigError

TABLES = [CACHE_POLICIES, CONTROLLERS, INPUT_TYPES, LOSSES, OVERLOAD, POLICIES]


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.what)
def test_each_literal_lists_exactly_its_table(table: Choice) -> None:
    assert typing.get_args(table.literal) == table.names
    assert all(o.help for o in table.options.values())


def test_a_literal_that_drifts_from_its_table_is_refused_at_import() -> None:
    with pytest.raises(TypeError, match="differs from its table"):
        Choice("thing", typing.Literal["a", "b"], {"a": Option("x")})


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.what)
def test_every_reference_loads(table: Choice) -> None:
    for name, option in table.options.items():
        if option.ref:
            assert table.load(name) is not None


def test_unknown_names_list_the_options() -> None:
    with pytest.raises(ConfigError, match=r"unknown loss 'hinge'; expected one of 0/1, squared"):
        LOSSES.check("hinge")
    with pytest.raises(ConfigError, match="unknown overload answer"):
        OVERLOAD.load("shrug")
    assert OVERLOAD.listing() == "default or reject"
    assert OVERLOAD.schema() == '"default" | "reject"'


def test_the_factories_follow_the_tables() -> None:
    from clipper.batching.controllers import make_controller
    from clipper.selection import make_loss, make_policy
    from clipper.selection.base import POLICIES as POLICY_NAMES
    from clipper.selection.losses import LOSSES as LOSS_NAMES

    assert POLICIES.names == POLICY_NAMES
    assert LOSSES.names == LOSS_NAMES
    for name in POLICIES:
        cls = POLICIES.load(name)
        assert cls.name == name  # the class answers to its table name
    assert type(make_policy("ucb1", ["a", "b"])).__name__ == "UCB1"
    assert make_loss("absolute", scale=2.0)(1.0, 2.0) == 0.5
    assert make_controller("fixed", target_s=0.01, size=3).max_batch_size() == 3
    with pytest.raises(ConfigError, match="unknown batching controller 'lifo'"):
        make_controller("lifo", target_s=0.01)
    with pytest.raises(ConfigError, match="unknown selection policy 'greedy'; expected one of"):
        make_policy("greedy", ["a"])


def test_input_types_follow_the_table() -> None:
    from clipper.inputs import InputType

    assert {t.readable for t in InputType} == set(INPUT_TYPES.names)
    for name in INPUT_TYPES:
        assert INPUT_TYPES.load(name).readable == name
        assert InputType.parse(name) is INPUT_TYPES.load(name)


def test_the_literals_elsewhere_are_the_tables() -> None:
    from clipper import config, registry

    hints = typing.get_type_hints(registry.Application)
    assert typing.get_args(hints["overload"]) == OVERLOAD.names
    assert config.Controller is choices.Controller
    hints = typing.get_type_hints(config.FrontendConfig)
    assert typing.get_args(hints["cache_policy"]) == CACHE_POLICIES.names


def test_the_admin_schemas_name_the_tables() -> None:
    from clipper.frontend import admin_fields

    text = " ".join(v for v in vars(admin_fields).values() if isinstance(v, str))
    text += " ".join(str(v) for v in admin_fields.SCHEMAS.values())
    for table in (CONTROLLERS, LOSSES, OVERLOAD):
        assert table.schema() in text, table.what
    for name in POLICIES.names + INPUT_TYPES.names:
        assert f'"{name}"' in text, name


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for cmd, child in action.choices.items():
                out.update({f"{cmd} {k}": v for k, v in _actions(child).items()})
        else:
            out.update({o: action for o in action.option_strings})
    return out


def test_the_cli_choices_come_from_the_tables() -> None:
    from clipper.cli import _parser

    actions = _actions(_parser())
    for option, table in (
        ("app register --overload", OVERLOAD),
        ("app update --overload", OVERLOAD),
        ("app register --policy", POLICIES),
        ("app update --loss", LOSSES),
        ("model deploy --controller", CONTROLLERS),
        ("start --cache-policy", CACHE_POLICIES),
    ):
        action = actions[option]
        assert tuple(action.choices or ()) == table.names, option
        assert table.help() in (action.help or ""), option
