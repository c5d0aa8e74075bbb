# Load and validate the spec, plan the jobs. The rules below stay thin: they call `longca`.
import sys
from pathlib import Path

import yaml
from snakemake.utils import validate

from longca.run.plan import plan_jobs
from longca.spec.load import load_spec

SPEC_FILE = config.get("spec", "specs/default.yaml")
RESULTS = config.get("results", "results")
REPORTS = config.get("reports", "reports")
CHUNK = config.get("chunk_size")  # overrides the spec's chunk_size when set

with open(SPEC_FILE) as _fh:
    _raw = yaml.safe_load(_fh)
# Snakemake's own JSON-schema check first, then longca's (same schema plus semantic checks),
# both before any job is scheduled.
validate(_raw, "../schemas/spec.schema.yaml")
SPEC = load_spec(SPEC_FILE)
CELLS, JOBS = plan_jobs(SPEC, RESULTS, chunk_size=int(CHUNK) if CHUNK else None,
                        warn=lambda m: print(m, file=sys.stderr))
CELL_OUTPUTS = [c.output(RESULTS) for c in CELLS]
# A planned job has cells still to write, so a marker of it is stale (left by a run whose cells were
# deleted since): without it, the job's marker is missing and Snakemake runs the job. A job touches
# its marker after its last cell, so no process removes the marker of a job that completed.
for _job in JOBS:
    Path(_job.marker).unlink(missing_ok=True)
JOB_MARKERS = [j.marker for j in JOBS]
AGGREGATE = f"{RESULTS}/{SPEC.name}/all.parquet"
REPORT_INDEX = f"{REPORTS}/{SPEC.name}/index.html"
