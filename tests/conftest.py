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
# carry @pytest.mark.slow. The first block: each took over 20 s of wall time (the comment: all its
# parametrisations) with --durations=0 on the loaded 2-core machine of 2026-12-03 (about 3-7x an idle one);
# together about 360 s of the suite's 500 s of CPU. The second block: see its comment.
# tests/project/test_slow_marker.py checks every entry names a test.
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
    "test_import_effects.py::test_importing_our_packages_reads_no_argv_no_environment_and_never_exits",  # 11 s
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
    # Over about 8 s of wall time (about 2 s of CPU) in the quick tier's own --durations=80 run of 2026-12-03 at
    # load 1.7-8 on 2 cores (its 1574 s wall, 410 s CPU): marked so that `-m "not slow"` fits in 3 minutes.
    "test_bma_agreement.py::test_cli_trains_per_L_and_tracks_bma",  # 9 s
    "test_cape_embedding.py::test_cape_properties_hold_on_small_random_graphs",  # 18 s
    "test_cape_structure.py::test_deterministic_for_a_seed",  # 8 s
    "test_catformer.py::test_analyses_run_or_refuse_in_one_line",  # 118 s
    "test_checkpoint_and_train.py::test_train_cli_help_and_bad_values",  # 22 s
    "test_chen.py::test_inspect_runs",  # 42 s
    "test_chen.py::test_the_others_refuse_in_one_line",  # 84 s
    "test_circuit.py::test_the_default_finds_the_target_side_head_and_reports_node_level_sufficiency",  # 36 s
    "test_each_rule_everywhere.py::test_a_checkpoint_at_a_path_that_is_not_utf8_reads_as_at_any_other",  # 35 s
    "test_each_rule_everywhere.py::test_a_corrupt_training_state_names_the_command_that_starts_afresh",  # 56 s
    "test_each_rule_everywhere.py::test_a_json_output_is_checked_again_under_its_lock_before_it_is_replaced",  # 9 s
    "test_each_rule_everywhere.py::test_a_key_map_constant_beyond_the_tensors_dtype_names_the_key_and_the_dtype",  # 18 s
    "test_each_rule_everywhere.py::test_a_kill_between_a_checkpoint_and_its_snapshot_is_mended_by_resume",  # 18 s
    "test_each_rule_everywhere.py::test_a_kill_inside_a_snapshot_write_leaves_nothing_after_resume",  # 20 s
    "test_each_rule_everywhere.py::test_a_standard_training_into_an_out_another_trains_into_is_refused_at_once",  # 11 s
    "test_each_rule_everywhere.py::test_a_symlinked_out_is_written_through_and_the_link_stays",  # 56 s
    "test_each_rule_everywhere.py::test_an_evaluation_with_a_chunk_of_one_context_writes_no_nan",  # 20 s
    "test_each_rule_everywhere.py::test_every_path_flag_names_every_path_kind",  # 42 s
    "test_each_rule_everywhere.py::test_from_runs_takes_a_folder_whose_name_holds_an_equals_sign",  # 12 s
    "test_each_rule_everywhere.py::test_hugging_face_weights_that_do_not_cover_their_config_are_refused_by_name",  # 56 s
    "test_each_rule_everywhere.py::test_overwrite_keeps_the_old_snapshots_until_the_new_run_has_saved",  # 27 s
    "test_each_rule_everywhere.py::test_resume_with_other_steps_is_refused_and_changes_nothing",  # 8 s
    "test_each_rule_everywhere.py::test_training_on_one_evaluation_context_writes_no_nan",  # 10 s
    "test_each_rule_everywhere.py::test_two_collections_into_one_histories_file_keep_every_run",  # 25 s
    "test_each_rule_everywhere.py::test_two_standard_trainings_into_one_out_cannot_both_write_it",  # 23 s
    "test_edelman.py::test_analyses_run_or_refuse_in_one_line",  # 133 s
    "test_figure_layout.py::test_no_text_is_clipped_overlapped_or_over_another_panel",  # 21 s
    "test_formats_pipelines.py::test_inspect_credits_a_paper_literal_reimplementation_trained_to_bma",  # 24 s
    "test_head_ablation.py::test_cli_writes_figures_and_json_with_the_claim",  # 13 s
    "test_inspect.py::test_cli_on_a_pt_file_writes_the_report",  # 10 s
    "test_inspect_standard.py::test_same_numbers_as_inspect_under_its_own_file_names",  # 22 s
    "test_logpi_recovery.py::test_cli_theorem1_writes_numbers",  # 12 s
    "test_messages.py::test_every_entry_point_makes_the_missing_parents_of_out_and_json",  # 10 s
    "test_messages.py::test_the_summary_is_alone_on_stdout_and_a_log_gets_plain_progress_lines",  # 61 s
    "test_nichani_dags.py::test_bad_dags_are_one_line_and_exit_2",  # 68 s
    "test_paper.py::test_analyses_fix_the_thread_count_and_reject_a_bad_one",  # 10 s
    "test_phase_diagram.py::test_a_replot_reads_a_trained_sweep_back_unchanged",  # 11 s
    "test_phase_diagram.py::test_the_committed_figure_replots_the_committed_full_sweep",  # 25 s
    "test_standard_circuit.py::test_cli_writes_the_set_and_calls_an_untrained_model_a_plateau",  # 22 s
    "test_trajectory.py::test_the_cli_writes_the_set_with_every_snapshot_and_its_phases",  # 18 s
    "test_trajectory.py::test_train_steps_trains_and_reads_a_short_run_of_the_shipped_config",  # 17 s
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
