# longca: spec -> cells -> Parquet rows -> aggregate table -> static report.
#   snakemake --cores 2                                  (runs specs/default.yaml)
#   snakemake --cores 2 --config spec=specs/other.yaml  (any spec)
#   snakemake --profile profiles/slurm --config spec=... (a SLURM cluster)
from pathlib import Path

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
        # the markers of the jobs with cells to write (common.smk removes a stale one, so a deleted
        # cell's job runs again: the aggregate alone would not ask for a missing marker), and the
        # report, which needs the aggregate
        JOB_MARKERS,
        REPORT_INDEX,
    default_target: True


# What the run gave, in one line, and where the report is (cells by status: `longca.store.read`).
onsuccess:
    from longca.store.read import run_summary

    if Path(AGGREGATE).is_file():
        print(run_summary(AGGREGATE, REPORT_INDEX if Path(REPORT_INDEX).is_file() else None))


include: "workflow/rules/cells.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"
