"""Shared fixtures: every test starts from seeded generators; small builders keep tests short. ``SLOW``:
the tests marked ``slow`` (``python -m pytest -m "not slow"`` leaves them out)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from models.training.train import TrainConfig
from probes import MarkovTreeTask

# The heaviest tests, by file and function (every parametrisation), marked `slow` here rather than in their
# files so that one table says what a quick run leaves out (tests/README.md); a new slow test may instead
# carry @pytest.mark.slow. Each took over 20 s of wall time (the comment: all its parametrisations) with
# --durations=0 on the loaded 2-core machine of 2026-12-03 (about 3-7x an idle one); together about 360 s of
# the suite's 500 s of CPU. tests/project/test_slow_marker.py checks every entry names a test.
SLOW = {
    "test_activation_patching.py::test_cli_writes_heatmaps_and_json",  # 27 s
    "test_bad_input_resume_and_hooks.py::test_bad_input_gives_one_line_error_and_changes_nothing",  # 23 s
    "test_bad_input_resume_and_hooks.py::test_cli_subprocess_stderr_is_one_line",  # 38 s
    "test_cape_downstream.py::test_tiny_run_identity_beats_no_position_and_is_seeded",  # 24 s
    "test_cape_structure.py::test_analysis_bma_needs_fewer_samples_than_structure_learning",  # 29 s
    "test_cape_structure.py::test_quadratic_edges_are_invisible_to_the_linear_f_and_found_by_the_mlp_f",  # 63 s
    "test_circuit.py::test_batched_exact_patching_equals_edge_by_edge_runs_per_context",  # 21 s
    "test_circuit.py::test_cli_writes_the_set_and_refuses_an_unknown_node_in_one_line",  # 23 s
    "test_circuit.py::test_every_receiver_edit_moves_only_its_own_input_at_its_positions",  # 21 s
    "test_distributed.py::test_two_gloo_processes_match_one_process",  # 41 s
    "test_entry_point_convention.py::test_a_malformed_omp_num_threads_is_one_line_not_libgomps",  # 43 s
    "test_entry_point_convention.py::test_a_reader_that_goes_away_ends_a_successful_run_quietly",  # 47 s
    "test_entry_point_convention.py::test_entry_point_bad_input_is_one_line_and_changes_nothing",  # 30 s
    "test_every_family.py::test_each_analysis_runs_or_refuses_in_one_line",  # 64 s
    "test_formats_pipelines.py::test_every_gpt2_config_flag_matches_transformers_own_forward",  # 22 s
    "test_formats_pipelines.py::test_inspect_runs_on_every_format",  # 49 s
    "test_layering.py::test_the_checks_catch_the_cycles_that_were_there",  # 21 s
    "test_newcomer.py::test_an_analysis_of_another_checkpoint_leaves_the_committed_figures_alone",  # 39 s
    "test_optim.py::test_freed_memory_is_reused_without_faulting_in_fresh_pages",  # 50 s
    "test_sized_before_allocation.py::test_a_forked_case_is_what_a_fresh_interpreter_does",  # 71 s
    "test_sized_before_allocation.py::test_a_large_file_beside_the_weights_is_never_read",  # 42 s
    "test_sized_before_allocation.py::test_sizes_and_numbers_are_one_line_exit_2_bounded_and_change_nothing",  # 169 s
    "test_sources.py::test_inspect_on_standard_reads_task_json_once",  # 22 s
    "test_sweep.py::test_a_failing_job_raises_here",  # 50 s
    "test_sweep.py::test_results_come_back_in_order_at_the_threads_asked",  # 60 s
    "test_sweep.py::test_the_submitit_path_equals_the_cells_run_directly",  # 59 s
    "test_sweep.py::test_the_two_cell_sweep_through_the_local_engine_equals_the_cells_run_directly",  # 62 s
    "test_task_family.py::test_bad_task_input_is_one_line_and_exit_2",  # 42 s
    "test_task_family.py::test_each_task_runs_through_both_trainers_inspect_and_trajectory",  # 413 s
    "test_trajectory.py::test_snapshots_of_models_standard_are_read_end_to_end",  # 24 s
    "test_work_never_lost.py::test_kill9_at_random_instants_then_resume_gives_the_uninterrupted_weights",  # 63 s
}


def pytest_collection_modifyitems(items):
    for item in items:
        if f"{item.path.name}::{item.originalname}" in SLOW:
            item.add_marker(pytest.mark.slow)


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
