"""Shared fixtures: every test starts from seeded generators; small builders keep tests short. ``SLOW``:
the tests marked ``slow`` (``python -m pytest -m "not slow"`` leaves them out). ``FIGURES``: the tests that
draw an analysis's figures; every other test builds them (``figures()`` runs) but writes a placeholder
where the PNG and PDF would be (``_figures_drawn_only_where_checked``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from inproc import run as run_in_process

from analyses import common
from models.plumbing import io
from models.training.standard import train_standard
from models.training.train import TrainConfig, train
from probes import MarkovTreeTask

# The heaviest tests, by file and function (every parametrisation together), with their CPU seconds, marked
# `slow` here rather than in their files so that one table says what a quick run leaves out (tests/README.md); a
# new slow test goes here, or carries @pytest.mark.slow. Each took 1.5 s of CPU or more (this process's, its
# children's and its forked cases') in `python -m pytest -n 0` of 2026-12-04 (the whole suite less
# tests/project/test_docs.py: 263 s of CPU, these 34 201 s; test_docs.py alone, after its renders were
# committed: 89 s; the tests merged since, from the run of 22:19 with 2 workers); the first forked case of a
# process also pays for the fork server's imports (about 4 s). The seconds also order the files
# (``pytest_collection_modifyitems``).
# tests/project/test_slow_marker.py checks every entry names a test.
SLOW = {
    "test_activation_patching.py::test_cli_writes_heatmaps_and_json": 1.5,
    "test_activation_patching.py::test_shipped_checkpoint_all_heads_restore_clean_and_nothing_gives_zero": 1.8,
    "test_cape_downstream.py::test_tiny_run_identity_beats_no_position_and_is_seeded": 2.7,
    "test_cape_embedding.py::test_cape_properties_hold_on_small_random_graphs": 2.5,
    "test_cape_structure.py::test_analysis_bma_needs_fewer_samples_than_structure_learning": 3.7,
    "test_cape_structure.py::test_quadratic_edges_are_invisible_to_the_linear_f_and_found_by_the_mlp_f": 7.4,
    "test_circuit.py::test_batched_exact_patching_equals_edge_by_edge_runs_per_context": 1.9,
    "test_circuit.py::test_exact_edge_scores_equal_plain_torch_hooks_on_the_huggingface_gpt2": 6.7,
    "test_circuit.py::test_the_default_finds_the_target_side_head_and_reports_node_level_sufficiency": 4.4,
    "test_circuit_library.py::test_the_notebook_call_on_the_shipped_gpt2_equals_the_command_lines_json": 40.0,
    "test_distributed.py::test_two_gloo_processes_match_one_process": 12.1,
    "test_docs.py::test_howto_python_blocks_run": 18.6,
    "test_docs.py::test_mkdocs_build_strict": 9.2,
    "test_docs.py::test_readme_example_runs_as_written": 6.1,
    "test_docs.py::test_tutorial_runs_top_to_bottom": 54.7,
    "test_each_rule_everywhere.py::test_every_float_flag_refuses_a_value_that_is_not_finite": 1.5,
    "test_entry_point_convention.py::test_a_malformed_omp_num_threads_is_one_line_not_libgomps": 3.5,
    "test_entry_point_convention.py::test_a_reader_that_goes_away_ends_a_successful_run_quietly": 4.9,
    "test_every_family.py::test_each_analysis_runs_or_refuses_in_one_line": 3.8,
    "test_figure_layout.py::test_figures_measured_on_a_small_model_keep_every_text_on_the_canvas_and_apart": 12.9,
    "test_figure_layout.py::test_no_text_is_clipped_overlapped_or_over_another_panel": 6.9,
    "test_formats_pipelines.py::test_every_gpt2_config_flag_matches_transformers_own_forward": 3.4,
    "test_formats_pipelines.py::test_every_release_config_loads_with_transformer_lens_numbers": 2.1,
    "test_formats_pipelines.py::test_inspect_runs_on_every_format": 1.7,
    "test_howtos.py::test_add_format_page_end_to_end": 14.2,
    "test_howtos.py::test_write_analysis_page_end_to_end": 6.1,
    "test_import_effects.py::test_importing_our_packages_reads_no_argv_no_environment_and_never_exits": 3.7,
    "test_inspect.py::test_one_copyer_for_three_demonstrations_is_not_called_the_papers_circuit": 1.8,
    "test_layering.py::test_the_checks_catch_the_cycles_that_were_there": 3.8,
    "test_messages.py::test_the_summary_is_alone_on_stdout_and_a_log_gets_plain_progress_lines": 2.4,
    "test_optim.py::test_freed_memory_is_reused_without_faulting_in_fresh_pages": 7.3,
    "test_phase_diagram.py::test_the_committed_figure_replots_the_committed_full_sweep": 3.6,
    "test_sized_before_allocation.py::test_a_forked_case_is_what_a_fresh_interpreter_does": 7.4,
    "test_sized_before_allocation.py::test_sizes_and_numbers_are_one_line_exit_2_bounded_and_change_nothing": 3.9,
    "test_sources.py::test_inspect_on_standard_reads_task_json_once": 2.8,
    "test_nichani_dags.py::test_a_tiny_catformer_sweep_measures_their_edges_from_A": 3.0,
    "test_sweep.py::test_a_failing_job_raises_here": 7.5,
    "test_sweep.py::test_ctrl_c_to_the_main_process_stops_the_workers_and_keeps_what_finished": 3.8,
    "test_sweep.py::test_results_come_back_in_order_at_the_threads_asked": 7.6,
    "test_sweep.py::test_the_submitit_path_equals_the_cells_run_directly": 11.3,
    "test_sweep.py::test_the_two_cell_sweep_through_the_local_engine_equals_the_cells_run_directly": 11.3,
    "test_task_family.py::test_each_task_runs_through_both_trainers_inspect_and_trajectory": 4.4,
    "test_trajectory.py::test_the_cli_writes_the_set_with_every_snapshot_and_its_phases": 2.6,
    "test_work_never_lost.py::test_kill9_at_random_instants_then_resume_gives_the_uninterrupted_weights": 4.9,
}


# The tests that render an analysis's figures to PNG and PDF through ``common.render_figure`` (the figures'
# layout is checked apart, by tests/analyses/test_figure_layout.py, on the figures themselves). Everywhere
# else a run of an analysis builds its figures and writes PLACEHOLDER in their files: rendering a figure twice
# (PNG at 150 dpi, PDF) costs more than most of the small analyses the tests run. A test that reads a figure's
# pixels or bytes goes here, or carries @pytest.mark.figures.
FIGURES = {
    "test_slow_marker.py::test_an_analysis_renders_its_figures_where_asked",
}
PLACEHOLDER = b"not drawn: tests/conftest.py FIGURES lists the tests that draw figures\n"


def pytest_configure(config):
    """An xdist worker's share of the cores for torch's threads (2 cores, 2 workers: 1 thread each), so that
    the workers' OpenMP threads do not outnumber the cores and spin against each other."""
    if hasattr(config, "workerinput"):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(config.workerinput["workercount"])))


def pytest_collection_modifyitems(items):
    """Mark the tests of ``SLOW`` and ``FIGURES``; run the files that hold the most ``SLOW`` seconds first, each
    file's tests in their order. Under pytest-xdist (``--dist loadfile``, pyproject.toml) a worker takes a
    whole file at a time: the longest started first, the workers end together."""
    seconds = {}
    for name, cpu in SLOW.items():
        seconds[name.partition("::")[0]] = seconds.get(name.partition("::")[0], 0) + cpu
    items.sort(key=lambda item: -seconds.get(item.path.name, 0))  # stable: the order within a file is kept
    for item in items:
        name = f"{item.path.name}::{item.originalname}"
        if name in SLOW:
            item.add_marker(pytest.mark.slow)
        if name in FIGURES:
            item.add_marker(pytest.mark.figures)


@pytest.fixture(autouse=True)
def _figures_drawn_only_where_checked(request, monkeypatch):
    """Outside ``FIGURES``, ``render_figure`` writes ``PLACEHOLDER``: the figure is built, its file written
    as one set with the JSON (``models.plumbing.io.write_set``), nothing rendered. Processes forked or
    started by a test draw as a user's do."""
    if request.node.get_closest_marker("figures") is None:
        monkeypatch.setattr(common, "render_figure", lambda fig, path: Path(path).write_bytes(PLACEHOLDER))


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def build_task(d_vocab: int = 4, n_examples: int = 3, seq_len: int = 5, seed: int = 0, **kw) -> MarkovTreeTask:
    """A small random task (override any field)."""
    return MarkovTreeTask.random(d_vocab, n_examples, seq_len, seed=seed, **kw)


def tiny_train_config(tmp_path, **kw) -> TrainConfig:
    """A training run of a few seconds into ``tmp_path / "run"`` (override any field)."""
    base = dict(d_vocab=3, n_examples=2, seq_len=4, steps=12, batch_size=16, eval_every=6, eval_contexts=32)
    return TrainConfig(**{**base, "out": str(tmp_path / "run"), **kw})


@pytest.fixture
def small_task() -> MarkovTreeTask:
    return build_task()


@pytest.fixture(scope="session")
def _trained_runs(request, tmp_path_factory) -> Path:
    """Where ``trained`` keeps the runs it trained: new each session, shared by its xdist workers (the parent
    of their temporary folders)."""
    base = tmp_path_factory.getbasetemp()
    store = (base.parent if hasattr(request.config, "workerinput") else base) / "trained"
    store.mkdir(exist_ok=True)
    return store


@pytest.fixture(scope="session")
def trained(_trained_runs):
    """``trained(what, out=None) -> out``: the folder of a training run, copied to ``out``; each distinct
    training is run once a session, for every test (and xdist worker) that asks for it. ``what``: a
    ``TrainConfig`` or ``StandardConfig`` (``out`` defaults to its own), trained as ``train(cfg,
    progress=False)`` / ``train_standard(cfg, progress=False)`` do; or a command line ``("models.train",
    *flags)`` without ``--out``, run in this process as ``python -m`` runs it. The run's own ``out`` (in its
    config.json) names the store, which resuming allows (``RESUME_MAY_DIFFER``). The copy is the test's to
    change; the store is never handed out."""

    def get(what, out: str | Path | None = None) -> Path:
        if isinstance(what, tuple):
            identity, out = list(what), Path(out)
        else:
            identity = [type(what).__name__, {k: v for k, v in dataclasses.asdict(what).items() if k != "out"}]
            out = Path(what.out if out is None else out)
        key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
        run, done = _trained_runs / key, _trained_runs / f"{key}.done"
        with io.exclusive_lock(_trained_runs / f"{key}.lock"):  # another worker training it: wait for its run
            if not done.exists():
                shutil.rmtree(run, ignore_errors=True)
                if isinstance(what, tuple):
                    proc = run_in_process(*what, "--out", str(run), cwd=_trained_runs)
                    assert proc.returncode == 0, (what, proc.stderr[-2000:])
                else:
                    trainer = train if isinstance(what, TrainConfig) else train_standard
                    trainer(dataclasses.replace(what, out=str(run)), progress=False)
                done.touch()
        shutil.copytree(run, out, symlinks=True)
        return out

    return get
