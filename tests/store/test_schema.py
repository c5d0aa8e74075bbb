"""docs/schema.md's result-schema table is the one generated from longca.store.schema."""

import re
from pathlib import Path

from longca.store.schema import SCHEMA, schema_markdown

README = Path(__file__).resolve().parents[2] / "docs" / "schema.md"


def test_readme_schema_table_is_the_generated_one():
    assert schema_markdown() in README.read_text(encoding="utf-8")


def test_every_generated_row_has_three_cells():
    lines = schema_markdown().splitlines()
    assert len(lines) == 2 + len(SCHEMA)
    for line in lines:
        # split on pipes not escaped with a backslash
        assert len(re.split(r"(?<!\\)\|", line)) == 5, line
