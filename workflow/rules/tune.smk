# Learning-rate re-tuning sweep (config scaling.tune). Every candidate is a run of the
# run table (run_id component _m{multiplier}_wu{warm-up}), trained by train_run to the
# study's target like every run, so it is cached and resumable. This checkpoint picks
# the best candidate per (partition, backend, per-worker batch, workers) on validation
# time to target (ties: best validation loss); the selected candidates then re-run with
# fresh seeds (run ids _rerun_r{k}, scaling.tune.rerun_repeats each): train_run jobs
# like any other, requested by aggregate_runs through this checkpoint's selection.csv
# (common.smk rerun_ids). Only the re-runs enter the tuned results: aggregate_runs
# writes tuned.csv after them.


checkpoint select_tuned:
    input:
        config=f"{RESULTS}/config/full.json",
        target=TARGET,
        records=candidate_records,
    output:
        f"{RESULTS}/scaling/selection.csv",
    log:
        f"{RESULTS}/logs/select_tuned.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        runsdir=runs_dir_of_input_config,
    shell:
        "{params.hvd} select-tuned --runs-dir {params.runsdir} --config {input.config}"
        " --target {input.target} --out {output} > {log} 2>&1"
