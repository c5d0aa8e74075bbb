"""`longca masks`: list, stats --json, draw, and clear errors."""

import json

import pytest

from longca.cli import main
from longca.masks import slices as sl


def test_list_names_all_14(capsys):
    assert main(["masks", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 14
    assert {r["family"] for r in rows} == {"regular", "heterogeneous", "dynamic"}


def test_stats_json_reports_exact_area_and_the_slices(capsys):
    assert main(["masks", "stats", "prefix_lm_causal", "--seqlen", "1001", "--set", "prefix=10", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # 10 x 10 prefix plus causal rows 10..1000 each seeing q + 1 keys
    assert data["area"] == 100 + sum(q + 1 for q in range(10, 1001))
    assert data["params"] == {"prefix": 10}
    assert data["density"] == data["area"] / 1001**2
    assert sl.area(sl.make_slices(data["slices"])) == data["area"]


def test_stats_records_documents_and_seed(capsys):
    main(["masks", "stats", "causal_document", "--seqlen", "5000", "--seed", "3", "--json"])
    a = json.loads(capsys.readouterr().out)
    main(["masks", "stats", "causal_document", "--seqlen", "5000", "--seed", "3", "--json"])
    assert json.loads(capsys.readouterr().out) == a
    assert sum(a["documents"]) == 5000 and a["num_documents"] == len(a["documents"])
    assert a["params"]["distribution"] == "pile"  # auto at S <= 8K


def test_bad_parameter_is_one_clear_line(capsys):
    assert main(["masks", "stats", "sliding_window", "--seqlen", "64", "--set", "window=x"]) == 2
    err = capsys.readouterr().err
    assert "parameter 'window' = 'x' is invalid; allowed: an integer" in err


def test_draw_writes_an_svg(tmp_path, capsys):
    out = tmp_path / "m.svg"
    assert main(["masks", "draw", "share_question", "--seqlen", "2000", "--out", str(out), "--cells", "16"]) == 0
    assert out.read_text().lstrip().startswith("<svg")


def test_lengths_are_written_as_in_specs(capsys):
    import json

    from longca.cli import main

    assert main(["masks", "stats", "causal_document", "--seqlen", "32K", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seqlen_q"] == 32768
    with pytest.raises(SystemExit):
        main(["masks", "stats", "causal", "--seqlen", "3Q"])
    assert "'3Q' is not a length" in capsys.readouterr().err
