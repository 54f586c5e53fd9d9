"""analyses.paper: every analysis it runs declares its figures, the gallery lists exactly those, bad --jobs."""

from __future__ import annotations

import pytest

from analyses import paper


def test_every_analysis_declares_figures_and_the_gallery_lists_them():
    modules = [paper.module_of(name) for name in paper.ANALYSES]
    text = paper.gallery(modules)
    for module in modules:
        assert isinstance(module.FIGURES, dict) and module.FIGURES, module.__name__
        assert callable(module.main), module.__name__
        for fig in module.FIGURES:
            assert f"[{fig}]({fig})" in text
    assert text.count("](") == sum(len(m.FIGURES) for m in modules)


def test_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        paper.main(["--jobs", "0", "--only", "copyers"])
    assert e.value.code == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err


def test_analyses_fix_the_thread_count_and_reject_a_bad_one(tmp_path, capsys):
    import torch

    from analyses import copyers

    before = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as e:
            copyers.main(["--threads", "0", "--out", str(tmp_path)])
        assert e.value.code == 2 and "--threads must be >= 1" in capsys.readouterr().err
        copyers.main(["--threads", "1", "--n-contexts", "16", "--out", str(tmp_path)])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
