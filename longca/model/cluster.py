"""A cluster as the CP model sees it: GPUs per node, an intra-node and an inter-node link.

Loaded from YAML (safe loader) and checked against `cluster.schema.yaml`; every error names the
field, the value and what is allowed. Bandwidths are what one GPU sends each way (GB/s, 1e9
bytes); latencies are per message. Global rank g sits on node g // gpus_per_node (torchrun's
order), so a Ulysses group of consecutive ranks stays inside a node when it fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jsonschema
import yaml


class ClusterError(ValueError):
    """A cluster file problem: `field` is a dotted path into the file."""

    def __init__(self, source: str, field: str, message: str):
        self.field = field
        super().__init__(f"cluster {source}: field '{field}': {message}")


@dataclass(frozen=True)
class Link:
    bandwidth_gbs: float
    latency_us: float
    source: str

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        return messages * self.latency_us * 1e-6 + nbytes / (self.bandwidth_gbs * 1e9)


@dataclass(frozen=True)
class Cluster:
    name: str
    gpu: str
    gpus_per_node: int
    nodes: int
    intra: Link
    inter: Link
    description: str = ""

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def link(self, a: int, b: int) -> Link:
        return self.intra if self.node(a) == self.node(b) else self.inter

    def group_link(self, members) -> Link:
        """The slowest link a collective over `members` crosses."""
        return self.intra if len({self.node(m) for m in members}) == 1 else self.inter

    @property
    def max_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def assumptions(self) -> str:
        return (
            f"{self.name}: {self.nodes} node(s) of {self.gpus_per_node} x {self.gpu}; intra-node "
            f"{self.intra.bandwidth_gbs:g} GB/s each way per GPU, {self.intra.latency_us:g} us per message "
            f"({self.intra.source}); inter-node {self.inter.bandwidth_gbs:g} GB/s, {self.inter.latency_us:g} us "
            f"({self.inter.source})"
        )


def _schema() -> dict:
    return yaml.safe_load(resources.files("longca.model").joinpath("cluster.schema.yaml").read_text())


def load_cluster(path: str | Path | None = None, *, text: str | None = None) -> Cluster:
    """Read and check a cluster file; ClusterError naming the field otherwise."""
    source = str(path) if path is not None else "(text)"
    if text is None:
        if path is None or not Path(path).is_file():
            raise ClusterError(source, "(file)", "does not exist")
        text = Path(path).read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClusterError(source, "(yaml)", f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ClusterError(source, "(top level)", f"a cluster is a mapping of fields, got {type(raw).__name__}")
    errors = list(jsonschema.Draft202012Validator(_schema()).iter_errors(raw))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        schema = err.schema if isinstance(err.schema, dict) else {}
        allowed = ""
        if err.validator == "additionalProperties" and isinstance(schema.get("properties"), dict):
            allowed = f"; allowed keys: {sorted(schema['properties'])}"
        elif schema.get("description"):
            allowed = f"; allowed: {schema.get('type', '')} ({schema['description']})"
        raise ClusterError(source, where, f"{err.message}{allowed}")
    links = raw["links"]
    return Cluster(
        name=raw["name"],
        gpu=raw["gpu"],
        gpus_per_node=raw["gpus_per_node"],
        nodes=raw["nodes"],
        intra=Link(**links["intra_node"]),
        inter=Link(**links["inter_node"]),
        description=raw.get("description", ""),
    )
