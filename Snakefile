# longca: spec -> cells -> Parquet rows -> aggregate table -> static report.
#   snakemake --cores 2                                  (runs specs/default.yaml)
#   snakemake --cores 2 --config spec=specs/other.yaml  (any spec)
#   snakemake --profile profiles/slurm --config spec=... (a SLURM cluster)
from snakemake.utils import min_version

min_version("9.0")


include: "workflow/rules/common.smk"


# Cheap, GPU-less steps run where Snakemake runs, not as cluster jobs.
localrules:
    all,
    aggregate,
    report,


rule all:
    input:
        CELL_OUTPUTS,
        AGGREGATE,
        REPORT_INDEX,
    default_target: True


include: "workflow/rules/cells.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"
