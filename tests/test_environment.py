"""The installed environment has what the library needs at start-up."""

import importlib


def test_colossalai_booster_imports():
    booster = importlib.import_module("colossalai.booster")
    assert hasattr(booster, "Booster") and hasattr(booster, "Plugin")


def test_package_entry_points_resolve():
    import opendit_lite

    for name in ("ModuleConverter", "OpenDiTPlugin", "LiteGen"):
        assert getattr(opendit_lite, name) is not None


def test_mosaicml_streaming_imports_without_its_pinned_dependencies():
    """mosaicml-streaming is installed with --no-deps (requirements-colossalai.txt): what it imports is in
    requirements.txt."""
    streaming = importlib.import_module("streaming")
    assert hasattr(streaming, "MDSWriter") and hasattr(streaming, "StreamingDataset")
