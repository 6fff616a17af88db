# Learning-rate re-tuning sweep (config scaling.tune). Every candidate is a run of the
# run table (run_id component _m{multiplier}_wu{warm-up}), trained by train_run like
# every run, so it is cached and resumable; aggregate_runs resolves its target. This
# rule picks the best candidate per (partition, backend, per-worker batch, workers).


rule select_tuned:
    input:
        runs=f"{RESULTS}/scaling/runs.csv",
        status=f"{RESULTS}/scaling/status.csv",
    output:
        report(
            f"{RESULTS}/scaling/tuned.csv",
            caption="../report/tuned.rst",
            category="Tables",
        ),
    log:
        f"{RESULTS}/logs/select_tuned.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
    shell:
        "{params.hvd} select-tuned --runs {input.runs} --status {input.status}"
        " --out {output} > {log} 2>&1"
