/*
 * test_list.h -- every test, once.  TEST(name, label): label cpu runs
 * everywhere (CI); gpu needs a device and exits 77 (skipped) without one.
 * tests/CMakeLists.txt reads this file to register each test with ctest.
 */
/* template.c and render.lua */
TEST(render_golden, cpu)
TEST(render_stable, cpu)
TEST(render_params, cpu)
TEST(sandbox_os, cpu)
TEST(sandbox_io, cpu)
TEST(sandbox_require, cpu)
TEST(sandbox_load, cpu)
TEST(sandbox_endless_loop, cpu)
TEST(sandbox_memory, cpu)
TEST(template_errors, cpu)
TEST(template_override_dir, cpu)
/* compile.c */
TEST(compile_sm80_sm90, cpu)
TEST(compile_lut_probe, cpu)
TEST(compile_error_log, cpu)
TEST(compile_isolated_crash, cpu)
TEST(resources_parse, cpu)
/* cache.c */
TEST(cache_hit_miss, cpu)
TEST(cache_corrupt_entry, cpu)
TEST(cache_truncated_entry, cpu)
TEST(cache_unwritable_dir, cpu)
TEST(cache_processes, cpu)
TEST(cache_list_clear, cpu)
TEST(cache_render_index, cpu)
/* errors and validation */
TEST(errors_ctx, cpu)
TEST(errors_variant, cpu)
TEST(errors_problem, cpu)
TEST(errors_launch, cpu)
TEST(errors_thread_local, cpu)
/* layout.c, reference.c */
TEST(lut_reference, cpu)
TEST(lut_validate, cpu)
TEST(convert_formats, cpu)
TEST(reference_small, cpu)
/* the kernel family, compile-only */
TEST(family_sample_sm80, cpu)
TEST(family_sample_sm90, cpu)
TEST(family_mma_sm80_sm90, cpu)
TEST(family_wgmma_sm90a, cpu)
TEST(family_wgmma_refusals, cpu)
TEST(family_refusals, cpu)
TEST(family_lut_disagrees, cpu)
/* tune.c */
TEST(tune_database, cpu)
/* hostile input: the C API, problems, the disk cache (test_hardening.c) */
TEST(api_null_corpus, cpu)
TEST(reference_bad_problems, cpu)
TEST(problem_check_corpus, cpu)
TEST(cache_hostile_files, cpu)
/* serving shapes without a GPU (test_serving.c) */
TEST(serving_plan, cpu)
TEST(serving_compile, cpu)
/* on a GPU */
TEST(gpu_lut_probe, gpu)
TEST(gpu_attention_matrix, gpu)
TEST(gpu_attention_auto, gpu)
TEST(gpu_family_cross, gpu)
TEST(gpu_family_axes, gpu)
TEST(gpu_family_seqlens, gpu)
TEST(gpu_mma_axes, gpu)
TEST(gpu_mma_cross, gpu)
TEST(gpu_wgmma_axes, gpu)
TEST(gpu_wgmma_cross, gpu)
TEST(gpu_wgmma_seqlens, gpu)
TEST(gpu_serving_decode, gpu)
TEST(gpu_serving_graph, gpu)
TEST(gpu_sanitize_serving, gpu)
TEST(gpu_sanitize_set, gpu)
TEST(gpu_sanitize_wgmma, gpu)
TEST(gpu_tune, gpu)
