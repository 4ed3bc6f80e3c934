import pytest

from clipper.errors import RegistryError
from clipper.inputs import InputType
from clipper.registry import Application, Change, ModelVersion, Registry


def app(name: str = "a", t: InputType = InputType.DOUBLES, slo: int = 20_000) -> Application:
    return Application(name=name, input_type=t, default_output="-1.0", latency_slo_micros=slo)


def model(name: str = "m", version: str = "1", t: InputType = InputType.DOUBLES) -> ModelVersion:
    return ModelVersion(name=name, version=version, input_type=t)


def test_default_output_that_is_json_is_embedded_as_json() -> None:
    assert app().default_value == -1.0
    text = Application("b", InputType.DOUBLES, "not json", 1000)
    assert text.default_value == "not json"


@pytest.mark.parametrize("slo", [0, -5, 2**31])
def test_slo_must_be_a_positive_int32(slo: int) -> None:
    with pytest.raises(RegistryError, match="latency_slo_micros"):
        app(slo=slo)


@pytest.mark.parametrize("name", ["", "a b", "a,b", "a:b", "-a", "x" * 200])
def test_names_are_checked(name: str) -> None:
    with pytest.raises(RegistryError, match="invalid application name"):
        app(name)


def test_changes_are_announced_in_order() -> None:
    r = Registry()
    seen: list[Change] = []
    r.subscribe(seen.append)
    r.add_app(app())
    r.add_model(model())
    r.set_model_version("m", "1")
    r.link("a", "m")
    r.delete_app("a")
    assert [(c.kind, c.op) for c in seen] == [
        ("app", "add"), ("model", "add"), ("version", "update"), ("link", "add"), ("app", "delete")
    ]  # fmt: skip
    assert "a" not in r.links


def test_original_error_messages() -> None:
    r = Registry()
    r.add_app(app())
    with pytest.raises(RegistryError, match="application 'a' already exists"):
        r.add_app(app())
    with pytest.raises(RegistryError, match=r"No model with name .m. exists\."):
        r.link("a", "m")
    r.add_model(model())
    with pytest.raises(RegistryError, match="model with name 'm' and version '1' already exists"):
        r.add_model(model())
    with pytest.raises(RegistryError, match="Cannot set non-existent version '2'"):
        r.set_model_version("m", "2")
    with pytest.raises(RegistryError, match="Cannot set version for nonexistent model 'z'"):
        r.set_model_version("z", "1")
    r.link("a", "m")
    with pytest.raises(RegistryError, match="already linked"):
        r.link("a", "m")


def test_link_refuses_incompatible_input_types_both_ways() -> None:
    r = Registry()
    r.add_app(app())
    r.add_model(model("s", t=InputType.STRINGS))
    with pytest.raises(RegistryError, match="takes strings but application 'a' takes doubles"):
        r.link("a", "s")
    r.add_model(model())
    r.link("a", "m")
    with pytest.raises(RegistryError, match="whose input type is doubles"):
        r.add_model(model("m", "2", t=InputType.STRINGS))


def test_one_model_per_app_until_the_selection_layer() -> None:
    r = Registry()
    r.add_app(app())
    r.add_model(model("m"))
    r.add_model(model("n"))
    r.link("a", "m")
    with pytest.raises(RegistryError, match="at most one model"):
        r.link("a", "n")


def test_deleting_the_current_version_clears_it() -> None:
    r = Registry()
    r.add_model(model())
    r.set_model_version("m", "1")
    r.delete_model_version("m", "1")
    assert "m" not in r.current
    assert "m" not in r.models
