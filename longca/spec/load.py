"""Load a spec: safe YAML, JSON-schema validation, defaults, then semantic checks.

Every error is a SpecError naming the field (a dotted path), the bad value and what is allowed,
raised before any cell is measured.
"""

from __future__ import annotations

import copy
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from longca import vocab
from longca.spec.model import DEFAULTS, INHERITED, MaskChoice, Spec, SpecError, Sweep, parse_seqlen
from longca.spec.validate import check_spec
from longca.vocab import DTYPE_ALIASES


def _schema() -> dict:
    text = resources.files("longca.spec").joinpath("spec.schema.yaml").read_text()
    return yaml.safe_load(text)


def _schema_error_message(err: jsonschema.ValidationError) -> SpecError:
    path = ".".join(str(p) for p in err.absolute_path) or "(top level)"
    schema = err.schema if isinstance(err.schema, dict) else {}
    allowed = ""
    if "enum" in schema:
        allowed = f"; allowed: {schema['enum']}"
    elif err.validator == "additionalProperties" and isinstance(schema.get("properties"), dict):
        allowed = f"; allowed keys: {sorted(schema['properties'])}"
    if re.search(r"(^|\.)(seqlens\.[0-9]+|seqlen)$", path):  # one message for a length, whatever the schema says
        return SpecError(path, f"{err.instance!r} is not a length; {vocab.SEQLEN_ALLOWED}")
    return SpecError(path, f"{err.message}{allowed}")


def load_spec(path: str | Path | None = None, *, text: str | None = None) -> Spec:
    """Read, schema-validate, default and semantically check a spec. Raises SpecError."""
    if text is None:
        if path is None:
            raise ValueError("load_spec needs a path or text")
        p = Path(path)
        if not p.is_file():
            raise SpecError("(file)", f"spec file {str(path)!r} does not exist")
        text = p.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError("(yaml)", f"not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise SpecError("(top level)", f"a spec is a mapping of fields, got {type(raw).__name__}")
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(list(e.absolute_path)), str(e.absolute_path)))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise _schema_error_message(best)
    spec = _build(raw, text, str(path or ""))

    check_spec(spec)
    return spec


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _mask_choice(entry: Any) -> MaskChoice:
    if isinstance(entry, str):
        return MaskChoice(entry)
    params = {k: v for k, v in entry.items() if k != "name"}
    return MaskChoice(entry["name"], tuple(sorted(params.items())))


def _build(raw: dict, text: str, path: str) -> Spec:
    top = _merge(DEFAULTS, {k: v for k, v in raw.items() if k != "sweeps"})
    sweeps = []
    names = set()
    for i, sw in enumerate(raw["sweeps"]):
        where = f"sweeps.{i}"
        if sw["name"] in names:
            raise SpecError(f"{where}.name", f"duplicate sweep name {sw['name']!r}; sweep names must be unique")
        names.add(sw["name"])
        merged = {}
        for key in INHERITED:
            if key in sw:
                merged[key] = _merge(top[key], sw[key]) if isinstance(sw[key], dict) else sw[key]
            elif key in top:
                merged[key] = top[key]
            else:
                raise SpecError(f"{where}.{key}", f"missing: set '{key}' in the sweep or at the top level")
        seqlens = tuple(parse_seqlen(s, f"{where}.seqlens.{j}") for j, s in enumerate(merged["seqlens"]))
        heads = tuple(tuple(int(x) for x in h.split(":")) for h in merged["heads"])
        dtypes = tuple(DTYPE_ALIASES.get(d, d) for d in merged["dtypes"])
        sweeps.append(
            Sweep(
                name=sw["name"],
                kernels=tuple(merged["kernels"]),
                masks=tuple(_mask_choice(m) for m in merged["masks"]),
                seqlens=seqlens,
                heads=heads,  # type: ignore[arg-type]
                head_dims=tuple(merged["head_dims"]),
                dtypes=dtypes,
                passes=tuple(merged["passes"]),
                batch=tuple(merged["batch"]),
                repeat=dict(merged["repeat"]),
                timeout_s=float(merged["timeout_s"]),
                chunk_size=int(merged["chunk_size"]),
                exclude=tuple(sw.get("exclude", ())),
                cp=dict(sw["cp"]) if "cp" in sw else None,
                mask_samples=dict(merged["mask_samples"]),
            )
        )
    return Spec(
        name=raw["name"],
        description=top["description"],
        device=top["device"],
        seed=int(top["seed"]),
        check=top["check"],
        mask_samples=top["mask_samples"],
        sweeps=tuple(sweeps),
        gpu_model=top.get("gpu_model"),
        source=text,
        path=path,
        raw=raw,
    )
