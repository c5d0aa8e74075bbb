rule report:
    input:
        AGGREGATE,
    output:
        REPORT_INDEX,
    params:
        spec=SPEC_FILE,
        out=lambda wc: f"{REPORTS}/{SPEC.name}",
    log:
        f"{RESULTS}/{SPEC.name}/logs/report.log",
    shell:
        "longca report --data {input:q} --spec {params.spec:q} --out {params.out:q} > {log:q} 2>&1"
