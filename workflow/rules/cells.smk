# One rule per pending chunk of cells: each job runs its cells in one process but every cell
# has its own output file, so a finished cell is never rerun and a missing one runs alone.
# Planning happens at DAG construction (common.smk): only missing or damaged cells get a job, and a
# job's marker is removed while it has cells to write, so Snakemake runs it. The marker is the job's
# declared output: declaring every cell file made Snakemake print them all for every job (tens of
# kilobytes a job); the job's cells are listed beside the marker and `longca run` fails a job whose
# cell files are not all written.
for _job in JOBS:

    rule:
        name:
            _job.name
        output:
            marker=_job.marker,
        log:
            f"{RESULTS}/{SPEC.name}/logs/{_job.name}.log",
        threads: _job.threads
        resources:
            gpu=_job.gpus,  # the SLURM plugin turns this into --gpus=N (0: none)
            tasks=_job.tasks,
            runtime=_job.runtime_min,
            mem_mb=_job.mem_mb,
            longca_kind=_job.kind,
        params:
            spec=SPEC_FILE,
            results=RESULTS,
            cells=str(Path(_job.marker).with_suffix(".cells")),  # the job's cell paths (common.smk)
        # the whole output to the log; to the terminal, one line per finished cell (status, time, TFLOP/s)
        shell:
            "longca run --spec {params.spec:q} --results {params.results:q} --outputs-from {params.cells:q} 2>&1"
            " | tee {log:q} | {{ grep --line-buffered '^\\[longca\\] ' || true; }}; touch {output.marker:q}"
