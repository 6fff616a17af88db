# Training stage (train env): one run per run_id of the scaling matrix, started as N
# ranks by the configured launcher (horovodrun, mpirun or srun); a torch-ddp run
# ({partition}_torch-ddp_...) goes through the same rules, resources and `hvdscale
# launch`, which starts it with torchrun, or one srun task per rank. The
# study-wide target validation loss is fixed first (calibrate_target: absolute, or
# from the calibration runs _cal_r{k}); every other run reads it and stops there.
# Besides its declared outputs a run keeps checkpoint/ (resume after a crash or a
# time limit), timeline.json (when training.timeline is on) and failure.json (when a
# run failed; aggregation lists it) in its run directory.


rule write_run_config:
    output:
        f"{RESULTS}/runs/{{run_id}}/config.json",
    log:
        f"{RESULTS}/logs/write_run_config/{{run_id}}.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        # only what this run depends on: editing another sweep keeps this run's results
        cfg=run_config_json,
    shell:
        "{params.hvd} write-config --section full --json {params.cfg:q} --out {output} > {log} 2>&1"


rule write_target_config:
    output:
        f"{RESULTS}/config/target.json",
    log:
        f"{RESULTS}/logs/write_target_config.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        # only what the target depends on: other edits keep target.json and every run
        cfg=target_config_json,
    shell:
        "{params.hvd} write-config --section full --json {params.cfg:q} --out {output} > {log} 2>&1"


rule calibrate_target:
    input:
        config=f"{RESULTS}/config/target.json",
        # the calibration runs (none in absolute mode)
        records=calibration_records,
    output:
        report(TARGET, caption="../report/target.rst", category="Tables"),
    log:
        f"{RESULTS}/logs/calibrate_target.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
    shell:
        "{params.hvd} calibrate-target --config {input.config} --records {input.records}"
        " --out {output} > {log} 2>&1"


rule write_preflight_config:
    output:
        f"{RESULTS}/config/preflight/{{partition}}.json",
    log:
        f"{RESULTS}/logs/write_preflight_config/{{partition}}.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        # the config without the report's keys: editing those repeats no preflight
        cfg=preflight_config_json,
    shell:
        "{params.hvd} write-config --section full --json {params.cfg:q} --out {output} > {log} 2>&1"


# A checkpoint: the partition's train_runs and allreduce sweeps that are still to be
# made wait for it without taking its JSON as an input (common.smk: _after_preflight),
# so a preflight run again, or missing, never retrains a finished run.
checkpoint preflight_partition:
    # one short job per partition, on its compute node(s), with the train env and the
    # launcher of the runs: modules, data, imports, GPUs, each backend's allreduce
    input:
        # a config edit (but the report's keys) or new data repeats the preflight
        config=f"{RESULTS}/config/preflight/{{partition}}.json",
        manifest=f"{RESULTS}/data/manifest.json",
    output:
        f"{RESULTS}/preflight/{{partition}}.json",
    log:
        f"{RESULTS}/logs/preflight_partition/{{partition}}.log",
    conda:
        f"../../{TRAIN_CONDA_ENV}"
    envmodules:
        *ENV_MODULES,
    threads: job_threads
    resources:
        **JOB_RESOURCES,
    params:
        hvd=LAUNCH,
        datadir=dir_of_input_manifest,
        launcher=launcher,
        python=train_python,
        # repeated when what it checks changes (nodes, backends, resources)
        checks=preflight_json,
    shell:
        "{params.hvd} preflight --config {input.config} --partition {wildcards.partition}"
        " --data-dir {params.datadir} --out {output} --launcher {params.launcher}"
        " --train-python {params.python} > {log} 2>&1"


rule train_run:
    input:
        config=f"{RESULTS}/runs/{{run_id}}/config.json",
        # the manifest stands for the whole split: split_dataset writes it together with
        # every shard, and training verifies each shard's sha256 against it
        manifest=f"{RESULTS}/data/manifest.json",
        # the target validation loss (not for a calibration run, which sets it)
        target=target_of_run,
        # none: a run still to train waits for its partition's preflight to pass
        preflight=preflight_of_run,
    output:
        metrics=f"{RESULTS}/runs/{{run_id}}/metrics.json",
        history=f"{RESULTS}/runs/{{run_id}}/history.csv",
    log:
        f"{RESULTS}/logs/train_run/{{run_id}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_run/{{run_id}}.tsv"
    conda:
        f"../../{TRAIN_CONDA_ENV}"
    envmodules:
        *ENV_MODULES,
    threads: job_threads
    resources:
        # the run's JobSpec, mapped to sbatch flags by the SLURM plugin (profiles/slurm)
        **JOB_RESOURCES,
    params:
        hvd=LAUNCH,
        datadir=dir_of_input_manifest,
        launcher=launcher,
        python=train_python,
        outdir=dir_of_output_metrics,
        target=target_argument,
    shell:
        "{params.hvd} launch --config {input.config} --run-id {wildcards.run_id}"
        " --data-dir {params.datadir} --out-dir {params.outdir} {params.target}"
        " --launcher {params.launcher} --train-python {params.python} > {log} 2>&1"


rule write_allreduce_config:
    output:
        f"{RESULTS}/config/allreduce/{{allreduce_id}}.json",
    log:
        f"{RESULTS}/logs/write_allreduce_config/{{allreduce_id}}.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        # only what this sweep depends on: editing a report key keeps the measured sweep
        cfg=allreduce_config_json,
    shell:
        "{params.hvd} write-config --section full --json {params.cfg:q} --out {output} > {log} 2>&1"


rule measure_allreduce:
    input:
        config=f"{RESULTS}/config/allreduce/{{allreduce_id}}.json",
        # none: waits for the partition's preflight while not yet measured
        preflight=preflight_of_allreduce,
    output:
        f"{RESULTS}/allreduce/{{allreduce_id}}.csv",
    log:
        f"{RESULTS}/logs/measure_allreduce/{{allreduce_id}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/measure_allreduce/{{allreduce_id}}.tsv"
    conda:
        f"../../{TRAIN_CONDA_ENV}"
    envmodules:
        *ENV_MODULES,
    threads: job_threads
    resources:
        **JOB_RESOURCES,
    params:
        hvd=LAUNCH,
        launcher=launcher,
        python=train_python,
        sweep=allreduce_sweep_args,
    shell:
        "{params.hvd} launch --program measure-allreduce --config {input.config}"
        " --allreduce-id {wildcards.allreduce_id} --out {output} {params.sweep}"
        " --launcher {params.launcher} --train-python {params.python} > {log} 2>&1"
