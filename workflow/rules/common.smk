# Load and validate the spec, plan the jobs. The rules below stay thin: they call `longca`.
import sys
from pathlib import Path

from longca.run.plan import plan_jobs
from longca.spec.load import SpecError, load_spec

SPEC_FILE = config.get("spec", "specs/default.yaml")
RESULTS = config.get("results", "results")
REPORTS = config.get("reports", "reports")
CHUNK = config.get("chunk_size")  # overrides the spec's chunk_size when set

# longca's check (the JSON schema, workflow/schemas/spec.schema.yaml, then the semantic checks), before
# any job is scheduled, with the one-line message and exit status of every other entry point
# (`longca validate`, `longca run`, `longca plan`): the field, the value and what is allowed.
try:
    SPEC = load_spec(SPEC_FILE)
except SpecError as _exc:
    print(f"longca: error: {_exc}", file=sys.stderr)
    sys.exit(2)
CELLS, JOBS = plan_jobs(SPEC, RESULTS, chunk_size=int(CHUNK) if CHUNK else None,
                        warn=lambda m: print(m, file=sys.stderr))
CELL_OUTPUTS = [c.output(RESULTS) for c in CELLS]
# A planned job has cells still to write, so a marker of it is stale (left by a run whose cells were
# deleted since): without it, the job's marker is missing and Snakemake runs the job. A job touches
# its marker after its last cell, so no process removes the marker of a job that completed.
for _job in JOBS:
    Path(_job.marker).unlink(missing_ok=True)
JOB_MARKERS = [j.marker for j in JOBS]
# Each job's cell paths, one a line, beside its marker: its command reads them from there
# (`longca run --outputs-from`), so a command line (printed by --printshellcmds, on errors and on
# interruption) stays short however many cells the job has.
for _job in JOBS:
    _cells = Path(_job.marker).with_suffix(".cells")
    _cells.parent.mkdir(parents=True, exist_ok=True)
    _cells.write_text("".join(f"{o}\n" for o in _job.outputs))
AGGREGATE = f"{RESULTS}/{SPEC.name}/all.parquet"
REPORT_INDEX = f"{REPORTS}/{SPEC.name}/index.html"
