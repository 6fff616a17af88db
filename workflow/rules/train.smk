# Training stage (train env): one Horovod run per run_id of the scaling matrix,
# started as N ranks by the configured launcher (horovodrun, mpirun or srun).
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


rule train_run:
    input:
        config=f"{RESULTS}/runs/{{run_id}}/config.json",
        # the manifest stands for the whole split: split_dataset writes it together with
        # every shard, and training verifies each shard's sha256 against it
        manifest=f"{RESULTS}/data/manifest.json",
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
        *TRAIN_MODULES,
    threads: local_threads
    resources:
        # mapped to sbatch flags by snakemake-executor-plugin-slurm (profiles/slurm)
        slurm_partition=res_partition,
        slurm_cluster=res_slurm_cluster,  # issue 12
        slurm_account=res_account,
        constraint=res_constraint,
        nodes=res_nodes,
        tasks=res_tasks,
        tasks_per_gpu=res_tasks_per_gpu,
        cpus_per_task=res_cpus_per_task,
        mem_mb=res_mem_mb,
        runtime=res_runtime,
        gres=res_gres,
        slurm_extra=res_slurm_extra,
        mpi=res_mpi,
    params:
        hvd=HVD,
        datadir=dir_of_input_manifest,
        launcher=launcher,
        python=train_python,
        outdir=dir_of_output_metrics,
    shell:
        "{params.hvd} launch --config {input.config} --run-id {wildcards.run_id}"
        " --data-dir {params.datadir} --out-dir {params.outdir}"
        " --launcher {params.launcher} --train-python {params.python} > {log} 2>&1"


rule measure_allreduce:
    input:
        config=f"{RESULTS}/config/full.json",
    output:
        f"{RESULTS}/allreduce/{{allreduce_id}}.csv",
    log:
        f"{RESULTS}/logs/measure_allreduce/{{allreduce_id}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/measure_allreduce/{{allreduce_id}}.tsv"
    conda:
        f"../../{TRAIN_CONDA_ENV}"
    envmodules:
        *TRAIN_MODULES,
    threads: local_threads
    resources:
        slurm_partition=res_partition,
        slurm_cluster=res_slurm_cluster,  # issue 12
        slurm_account=res_account,
        constraint=res_constraint,
        nodes=res_nodes,
        tasks=res_tasks,
        tasks_per_gpu=res_tasks_per_gpu,
        cpus_per_task=res_cpus_per_task,
        mem_mb=res_mem_mb,
        runtime=res_runtime,
        gres=res_gres,
        slurm_extra=res_slurm_extra,
        mpi=res_mpi,
    params:
        hvd=HVD,
        launcher=launcher,
        python=train_python,
    shell:
        "{params.hvd} launch --program measure-allreduce --config {input.config}"
        " --allreduce-id {wildcards.allreduce_id} --out {output}"
        " --launcher {params.launcher} --train-python {params.python} > {log} 2>&1"
