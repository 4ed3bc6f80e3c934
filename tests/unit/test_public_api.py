import clipper


def test_the_public_surface_is_exactly_all() -> None:
    public = {n for n in vars(clipper) if not n.startswith("_")}
    # subpackages are importable but not part of the flat surface
    modules = {n for n in public if type(getattr(clipper, n)).__name__ == "module"}
    assert public - modules == set(clipper.__all__) - {"__version__"}
    for name in clipper.__all__:
        assert hasattr(clipper, name), name


def test_every_error_is_a_clipper_error() -> None:
    errors = [getattr(clipper, n) for n in clipper.__all__ if n.endswith("Error")]
    assert errors
    assert all(issubclass(e, clipper.ClipperError) for e in errors)
