"""Job planning: only missing cells get work, and chunk names never depend on what is missing."""

from longca.run.cell import status_row
from longca.run.plan import plan_jobs
from longca.spec.load import load_spec
from longca.store.write import write_rows


def test_chunk_names_are_stable_while_cells_finish(tmp_path):
    spec = load_spec("specs/default.yaml")
    _, before = plan_jobs(spec, tmp_path, chunk_size=40)
    first = before[0]
    write_rows(first.outputs[3], [status_row(first.cells[3], "error", "written by another job")])
    _, after = plan_jobs(spec, tmp_path, chunk_size=40)
    # A cluster job re-reads the Snakefile while other chunks are half written: same names.
    assert [j.name for j in after] == [j.name for j in before]
    assert len(after[0].outputs) == len(first.outputs) - 1
    assert first.outputs[3] not in after[0].outputs


def test_finished_chunks_disappear_and_gpus_follow_the_plan(tmp_path):
    spec = load_spec("specs/default.yaml")
    _, jobs = plan_jobs(spec, tmp_path, chunk_size=1000)
    for job in jobs:
        for cell, out in zip(job.cells, job.outputs):
            write_rows(out, [status_row(cell, "unsupported", "test")])
    assert plan_jobs(spec, tmp_path)[1] == []
    cuda = load_spec("specs/h200-cp.yaml")
    _, cp_jobs = plan_jobs(cuda, tmp_path)
    assert {(j.kind, j.gpus, j.tasks) for j in cp_jobs} == {("cp", 2, 2)}


def test_retry_replans_only_cells_with_the_named_status(tmp_path):
    spec = load_spec("specs/default.yaml")
    _, jobs = plan_jobs(spec, tmp_path, chunk_size=1000)
    job = next(j for j in jobs if j.kind == "device")
    for k, (cell, out) in enumerate(zip(job.cells, job.outputs)):
        write_rows(out, [status_row(cell, "error" if k == 2 else "ok", "test")])
    again = [o for j in plan_jobs(spec, tmp_path)[1] for o in j.outputs]
    assert job.outputs[2] not in again
    retried = [o for j in plan_jobs(spec, tmp_path, retry=frozenset({"error"}))[1] for o in j.outputs]
    assert set(retried) - set(again) == {job.outputs[2]}
    assert plan_jobs(spec, tmp_path, retry=frozenset({"timeout"}))[1] == plan_jobs(spec, tmp_path)[1]
