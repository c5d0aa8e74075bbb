rule aggregate:
    input:
        # one marker per job that ran: every cell path here would make Snakemake's lines run to
        # tens of thousands of characters (cells written by other means: `longca aggregate` by hand)
        JOB_MARKERS,
    output:
        AGGREGATE,
    params:
        spec=SPEC_FILE,
        results=RESULTS,
    log:
        f"{RESULTS}/{SPEC.name}/logs/aggregate.log",
    shell:
        # The file list comes from the plan, not {input}: thousands of paths overflow a command line.
        "longca aggregate --spec {params.spec:q} --results {params.results:q} --out {output:q} > {log:q} 2>&1"
