"""One registration per analysis, its module: every module of analyses/ but the shared main and the paper run
is an analysis (``analyses.common.analysis_names``), ``ORDER`` names only those, each declares its needs
(``REQUIRES``) in its own module, and ``Analysis.from_module`` refuses a misspelt hook name instead of
ignoring it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from analyses import common

NOT_ANALYSES = {"__init__", "common", "paper"}  # the shared main and the paper run


def test_every_module_of_analyses_is_an_analysis_once():
    on_disk = {p.stem for p in (Path(common.__file__).parent).glob("*.py")} - NOT_ANALYSES
    assert sorted(common.analysis_names()) == sorted(on_disk)
    assert len(set(common.ORDER)) == len(common.ORDER) and set(common.ORDER) <= on_disk


@pytest.mark.parametrize("name", common.analysis_names())
def test_each_analysis_declares_its_needs_in_its_module(name):
    module = importlib.import_module(f"analyses.{name}")
    assert module.ANALYSIS.name == name
    assert "REQUIRES" in vars(module) and module.ANALYSIS.requires == module.REQUIRES
    # no --checkpoint exactly where it studies synthetic tasks of its own
    assert ("--checkpoint" in common.parser_for(module.ANALYSIS).format_help()) == (module.REQUIRES is not None)


def namespace(**extra):
    return {"NAME": "x", "__doc__": "x", "Config": common.Config, "compute": None, "figures": None, "summary": None,
            "REQUIRES": None, **extra}  # fmt: skip


@pytest.mark.parametrize("typo", ["Confg", "computes", "page", "records", "REQUIRE", "CHECKPOINTS"])
def test_a_misspelt_hook_is_refused(typo):
    with pytest.raises(ValueError, match=typo):
        common.Analysis.from_module(namespace(**{typo: None}))


def test_a_missing_requires_is_refused_and_helpers_are_not_hooks():
    ns = namespace(plot=None, measure=None, FIGURES={})
    del ns["REQUIRES"]
    with pytest.raises(ValueError, match="REQUIRES"):
        common.Analysis.from_module(ns)
    assert common.Analysis.from_module(namespace(plot=None, measure=None, FIGURES={})).requires is None
