# Data stage (workflow env): generate shards in parallel, validate every sample with
# pandera, split into train/val/test HDF5 shards (75/25, the validation split cut from
# the train share) with manifest.json.


rule write_data_config:
    output:
        f"{RESULTS}/config/data.json",
    log:
        f"{RESULTS}/logs/write_data_config.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        # a params change re-runs this rule (and so the data stage); training edits don't
        cfg=data_config_json,
    shell:
        "{params.hvd} write-config --section data --json {params.cfg:q} --out {output} > {log} 2>&1"


rule write_full_config:
    output:
        f"{RESULTS}/config/full.json",
    log:
        f"{RESULTS}/logs/write_full_config.log",
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        cfg=full_config_json,
    shell:
        "{params.hvd} write-config --section full --json {params.cfg:q} --out {output} > {log} 2>&1"


rule generate_shard:
    input:
        config=f"{RESULTS}/config/data.json",
    output:
        temp(f"{RESULTS}/data/raw/shard-{{shard}}.h5"),
    log:
        f"{RESULTS}/logs/generate_shard/{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/generate_shard/{{shard}}.tsv"
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
    shell:
        "{params.hvd} generate-shard --config {input.config} --shard {wildcards.shard}"
        " --out {output} > {log} 2>&1"


rule validate_shard:
    input:
        config=f"{RESULTS}/config/data.json",
        shard=f"{RESULTS}/data/raw/shard-{{shard}}.h5",
    output:
        f"{RESULTS}/data/raw/shard-{{shard}}.validation.json",
    log:
        f"{RESULTS}/logs/validate_shard/{{shard}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/validate_shard/{{shard}}.tsv"
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
    shell:
        "{params.hvd} validate-shard --config {input.config} --shard {input.shard}"
        " --out {output} > {log} 2>&1"


rule split_dataset:
    input:
        config=f"{RESULTS}/config/data.json",
        shards=expand(f"{RESULTS}/data/raw/shard-{{shard}}.h5", shard=SHARDS),
        validations=expand(f"{RESULTS}/data/raw/shard-{{shard}}.validation.json", shard=SHARDS),
    output:
        manifest=f"{RESULTS}/data/manifest.json",
        validation=f"{RESULTS}/data/validation.json",
        train=expand(f"{RESULTS}/data/train/shard-{{shard}}.h5", shard=TRAIN_SHARDS),
        val=expand(f"{RESULTS}/data/val/shard-{{shard}}.h5", shard=VAL_SHARDS),
        test=expand(f"{RESULTS}/data/test/shard-{{shard}}.h5", shard=TEST_SHARDS),
    log:
        f"{RESULTS}/logs/split_dataset.log",
    benchmark:
        f"{RESULTS}/benchmarks/split_dataset.tsv"
    conda:
        "../../envs/workflow.conda.yaml"
    params:
        hvd=HVD,
        outdir=dir_of_output_manifest,
    shell:
        "{params.hvd} split-dataset --config {input.config} --shards {input.shards}"
        " --validations {input.validations} --outdir {params.outdir} > {log} 2>&1"
