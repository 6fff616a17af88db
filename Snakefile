# hvdscale: a reproducible Horovod scaling study, from synthetic stress-strain curves
# to a typeset report. See README.md; every config key: config/README.md.
from snakemake.utils import min_version, validate

from hvdscale.slurm.partitions import dry_run_executor

min_version("9.0")


configfile: "config/config.yaml"


# the workflow description of Snakemake's HTML report (snakemake --report)
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# snakemake's own schema validation (fills defaults); common.smk already checked the
# config with readable messages and cross-key checks.
validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        f"{RESULTS}/report.pdf",
        # config key strict: fail when a value is worse than its reference
        strict=STRICT_TARGETS,


# Light steps run in the Snakemake process itself, also under the SLURM profile.
localrules:
    all,
    write_data_config,
    write_full_config,
    write_run_config,
    write_allreduce_config,
    write_target_config,
    write_preflight_config,
    calibrate_target,
    aggregate_runs,
    select_tuned,
    fit_costmodel,
    plot_scaling,
    build_report,
    check_references,
    enforce_references,
    export_study,


# Under the SLURM executor, before any job is queued. A hook, as the executor is known
# only once the workflow is parsed; not in the job step inside a SLURM job.
onstart:
    if workflow.is_main_process and getattr(workflow.executor_plugin, "name", "") == "slurm":
        check_slurm_partitions()


# A dry run runs no onstart: `snakemake -n` with the slurm executor (its profile's
# `executor: slurm`) is checked here, while the workflow is parsed.
if workflow.is_main_process and dry_run_executor() == "slurm":
    check_slurm_partitions()
