"""Cluster files: the committed ones load; a bad one is refused naming the field and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from longca.model.cluster import ClusterError, load_cluster

ROOT = Path(__file__).resolve().parents[2]
GOOD = """
name: t
gpu: H200
gpus_per_node: 8
nodes: 2
links:
  intra_node: {bandwidth_gbs: 366, latency_us: 111, source: measured}
  inter_node: {bandwidth_gbs: 45, latency_us: 20, source: assumed}
"""


def test_the_committed_clusters_load():
    files = sorted((ROOT / "specs" / "clusters").glob("*.yaml"))
    assert {f.stem for f in files} >= {"h200-nvlink", "h200-ib"}
    for f in files:
        c = load_cluster(f)
        assert c.name == f.stem and c.intra.bandwidth_gbs > c.inter.bandwidth_gbs


def test_ranks_fill_nodes_in_order():
    c = load_cluster(text=GOOD)
    assert [c.node(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1] and c.max_gpus == 16
    assert c.link(0, 7) is c.intra and c.link(7, 8) is c.inter
    assert c.group_link([0, 1, 2]) is c.intra and c.group_link([0, 8]) is c.inter
    assert c.intra.seconds(366e9) == pytest.approx(1 + 111e-6)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (("bandwidth_gbs: 45", "bandwidth_gbs: -1"), "links.inter_node.bandwidth_gbs", "GB/s"),
        (("nodes: 2", "nodes: two"), "nodes", "not of type 'integer'"),
        (("gpu: H200\n", "gpu: H200\nspeed: 3\n"), "(top level)", "allowed keys"),
        (("  inter_node: {bandwidth_gbs: 45, latency_us: 20, source: assumed}\n", ""), "links", "inter_node"),
    ],
)
def test_a_bad_cluster_names_the_field(change, field, words):
    with pytest.raises(ClusterError) as err:
        load_cluster(text=GOOD.replace(*change))
    assert err.value.field == field and words in str(err.value)


def test_not_a_cluster_at_all():
    with pytest.raises(ClusterError, match="not valid YAML"):
        load_cluster(text="name: [")
    with pytest.raises(ClusterError, match="a mapping of fields"):
        load_cluster(text="- 1")
    with pytest.raises(ClusterError, match="does not exist"):
        load_cluster(ROOT / "specs" / "clusters" / "missing.yaml")
