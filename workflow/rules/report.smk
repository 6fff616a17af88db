# Aggregation, allreduce cost model, plots and the PDF report (workflow env).


rule aggregate_runs:
    input:
        config=f"{RESULTS}/config/full.json",
        records=run_records,
        # the re-runs of the selected tuning candidates (checkpoint select_tuned)
        reruns=rerun_records,
    output:
        runs=report(
            f"{RESULTS}/scaling/runs.csv",
            caption="../report/runs.rst",
            category="Tables",
        ),
        summary=report(
            f"{RESULTS}/scaling/summary.csv",
            caption="../report/summary.rst",
            category="Tables",
        ),
        status=f"{RESULTS}/scaling/status.csv",
        epochs=f"{RESULTS}/scaling/epochs.csv",
        headline=f"{RESULTS}/scaling/headline.csv",
        tuned=report(
            f"{RESULTS}/scaling/tuned.csv",
            caption="../report/tuned.rst",
            category="Tables",
        ),
    log:
        f"{RESULTS}/logs/aggregate_runs.log",
    benchmark:
        f"{RESULTS}/benchmarks/aggregate_runs.tsv"
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        runsdir=runs_dir_of_input_config,
    shell:
        "{params.hvd} aggregate --runs-dir {params.runsdir} --config {input.config}"
        " --out-runs {output.runs} --out-summary {output.summary}"
        " --out-status {output.status} --out-epochs {output.epochs}"
        " --out-headline {output.headline} --out-tuned {output.tuned} > {log} 2>&1"


rule fit_costmodel:
    input:
        allreduce=allreduce_tables,
        runs=f"{RESULTS}/scaling/runs.csv",
        summary=f"{RESULTS}/scaling/summary.csv",
    output:
        f"{RESULTS}/scaling/costmodel.json",
    log:
        f"{RESULTS}/logs/fit_costmodel.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        model_bytes=model_bytes,
        max_workers=CFG["report"]["max_extrapolation_workers"],
        # validation: fit from <= this many ranks, error on the larger sweeps (0: none)
        fit_max=CFG["allreduce"]["fit_max_workers"] or 0,
    shell:
        "{params.hvd} fit-costmodel --allreduce {input.allreduce} --runs {input.runs}"
        " --summary {input.summary} --model-bytes {params.model_bytes}"
        " --max-workers {params.max_workers} --fit-max-workers {params.fit_max}"
        " --out {output} > {log} 2>&1"


rule plot_scaling:
    input:
        config=f"{RESULTS}/config/full.json",
        runs=f"{RESULTS}/scaling/runs.csv",
        summary=f"{RESULTS}/scaling/summary.csv",
        epochs=f"{RESULTS}/scaling/epochs.csv",
        costmodel=f"{RESULTS}/scaling/costmodel.json",
        headline=f"{RESULTS}/scaling/headline.csv",
    output:
        pdf=expand(f"{RESULTS}/plots/{{name}}.pdf", name=PLOTS),
        png=[
            report(
                f"{RESULTS}/plots/{fig.name}.png",
                caption=f"../report/{fig.caption_file}",
                category="Figures",
            )
            for fig in FIGURES
        ],
    log:
        f"{RESULTS}/logs/plot_scaling.log",
    benchmark:
        f"{RESULTS}/benchmarks/plot_scaling.tsv"
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        outdir=dir_of_output_pdf,
        # values of the captions' Jinja templates (Snakemake's report renders them)
        caption=caption_values(CFG),
    shell:
        "{params.hvd} plot --runs {input.runs} --summary {input.summary} --epochs {input.epochs}"
        " --costmodel {input.costmodel} --headline {input.headline} --config {input.config}"
        " --outdir {params.outdir}"
        " > {log} 2>&1"


rule check_references:
    input:
        config=f"{RESULTS}/config/full.json",
        runs=f"{RESULTS}/scaling/runs.csv",
        summary=f"{RESULTS}/scaling/summary.csv",
    output:
        f"{RESULTS}/scaling/references.csv",
    log:
        f"{RESULTS}/logs/check_references.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
    shell:
        "{params.hvd} check-references --config {input.config} --runs {input.runs}"
        " --summary {input.summary} --out {output} > {log} 2>&1"


# the system description per partition (issue 13): what rank 0 of each run recorded
rule tabulate_systems:
    input:
        config=f"{RESULTS}/config/full.json",
        records=run_records,
        runs=f"{RESULTS}/scaling/runs.csv",
    output:
        f"{RESULTS}/scaling/systems.csv",
    log:
        f"{RESULTS}/logs/tabulate_systems.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        runsdir=runs_dir_of_input_config,
    shell:
        "{params.hvd} tabulate-systems --runs-dir {params.runsdir} --runs {input.runs}"
        " --out {output} > {log} 2>&1"


# config key strict: the run fails (after the report) when a value is worse than its
# reference beyond the tolerance; the marker says none was
rule enforce_references:
    input:
        f"{RESULTS}/scaling/references.csv",
    output:
        f"{RESULTS}/scaling/references.ok",
    log:
        f"{RESULTS}/logs/enforce_references.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
    shell:
        "{params.hvd} check-references --check {input} --ok {output} > {log} 2>&1"


rule build_report:
    input:
        config=f"{RESULTS}/config/full.json",
        runs=f"{RESULTS}/scaling/runs.csv",
        summary=f"{RESULTS}/scaling/summary.csv",
        status=f"{RESULTS}/scaling/status.csv",
        costmodel=f"{RESULTS}/scaling/costmodel.json",
        references=f"{RESULTS}/scaling/references.csv",
        epochs=f"{RESULTS}/scaling/epochs.csv",
        tuned=f"{RESULTS}/scaling/tuned.csv",
        systems=f"{RESULTS}/scaling/systems.csv",
        headline=f"{RESULTS}/scaling/headline.csv",
        target=f"{RESULTS}/scaling/target.json",
        # each partition's preflight (none for a finished study from before it)
        preflight=preflight_records,
        plots=expand(f"{RESULTS}/plots/{{name}}.pdf", name=PLOTS),
        pngs=expand(f"{RESULTS}/plots/{{name}}.png", name=PLOTS),
    output:
        f"{RESULTS}/report.pdf",
    log:
        f"{RESULTS}/logs/build_report.log",
    benchmark:
        f"{RESULTS}/benchmarks/build_report.tsv"
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        plotsdir=dir_of_input_plots,
        configfiles=config_files,
    shell:
        "{params.hvd} report --config-file {params.configfiles} --config {input.config}"
        " --runs {input.runs} --summary {input.summary} --status {input.status}"
        " --costmodel {input.costmodel} --plots-dir {params.plotsdir}"
        " --references {input.references} --epochs {input.epochs} --tuned {input.tuned}"
        " --systems {input.systems} --headline {input.headline} --target {input.target}"
        " --preflight {input.preflight} --out {output} > {log} 2>&1"


# One archive of the finished study (not part of `all`): `make export`, or ask for
# results/study.tar.gz. `hvdscale rebuild` (`make report FROM=...`) regenerates every
# product from it and checks the bytes. Same config-file list as build_report.
rule export_study:
    input:
        config=f"{RESULTS}/config/full.json",
        records=run_records,
        reruns=rerun_records,
        allreduce=allreduce_tables,
        report=f"{RESULTS}/report.pdf",
        references=f"{RESULTS}/scaling/references.csv",
        systems=f"{RESULTS}/scaling/systems.csv",
    output:
        f"{RESULTS}/study.tar.gz",
    log:
        f"{RESULTS}/logs/export_study.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        configfiles=config_files,
        results=dir_of_output_archive,
    shell:
        "{params.hvd} export --config-file {params.configfiles} --results {params.results}"
        " --out {output} > {log} 2>&1"
