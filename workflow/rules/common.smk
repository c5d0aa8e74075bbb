# Load and validate the spec, plan the jobs. The rules below stay thin: they call `longca`.
import sys

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
AGGREGATE = f"{RESULTS}/{SPEC.name}/all.parquet"
REPORT_INDEX = f"{REPORTS}/{SPEC.name}/index.html"
