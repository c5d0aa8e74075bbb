rule aggregate:
    input:
        CELL_OUTPUTS,
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
