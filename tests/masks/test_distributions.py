"""Document-length distributions: shipped shapes, auto, user files, seeded sampling."""

import numpy as np
import pytest

from longca.masks import distributions as dist
from longca.masks.documents import LONG_DOC_RANGE, sample_documents


def cdf_at(hist, x):
    """Exact P(length <= x) of a histogram whose bins do not straddle x."""
    assert not ((hist.low <= x) & (hist.high > x)).any()
    return float(hist.prob[hist.high <= x].sum())


@pytest.mark.parametrize(
    "name,le500,le4096,longest",
    [
        ("pile", 0.715, 0.9595, 65536),
        ("prolong-64k", 0.603, 0.9745, 62000),
        ("prolong-512k", 0.637, 0.980, 475862),
    ],
)
def test_shipped_histograms_have_the_published_statistics(name, le500, le4096, longest):
    h = dist.load_histogram(name)
    assert cdf_at(h, 500) == pytest.approx(le500, abs=1e-9)
    assert cdf_at(h, 4096) == pytest.approx(le4096, abs=1e-9)
    assert h.high.max() == longest


def test_prolong_64k_top_bin_is_50k_to_62k():
    h = dist.load_histogram("prolong-64k")
    assert (h.low[-1], h.high[-1]) == (50000, 62000)


def test_auto_picks_the_corpus_by_length_as_the_paper():
    assert [dist.resolve("auto", s) for s in (1024, 8192, 8193, 65536, 65537, 524288)] == [
        "pile",
        "pile",
        "prolong-64k",
        "prolong-64k",
        "prolong-512k",
        "prolong-512k",
    ]


def test_samples_fill_exactly_are_seeded_and_follow_the_bins():
    rng = lambda s: np.random.default_rng(s)  # noqa: E731
    docs = sample_documents(100_000, "pile", rng(1))
    assert sum(docs) == 100_000 and min(docs) >= 1
    assert docs == sample_documents(100_000, "pile", rng(1))
    assert docs != sample_documents(100_000, "pile", rng(2))
    many = dist.load_histogram("pile").sample(rng(0), 200_000)
    assert abs(np.mean(many <= 500) - 0.715) < 0.005  # 200k draws: sd ~ 0.001
    u = dist.sampler("uniform")(rng(0), 10_000)
    assert u.min() >= 1 and u.max() <= 8192


def test_long_fraction_puts_that_share_of_tokens_in_long_documents():
    docs = sample_documents(200_000, "pile", np.random.default_rng(0), long_fraction=0.6)
    lo, hi = LONG_DOC_RANGE
    long_tokens = sum(d for d in docs if lo <= d <= hi)
    assert sum(docs) == 200_000
    # 60% of tokens drawn as U[8K, 30K] documents (the last one may be truncated below 8K)
    assert 0.6 * 200_000 - hi <= long_tokens <= 0.6 * 200_000 + 30_000


def test_user_histogram_csv_and_yaml(tmp_path):
    csv = tmp_path / "mine.csv"
    csv.write_text("# my corpus\nlow,high,weight\n10,10,1\n20,29,3\n")
    h = dist.load_histogram(f"file:{csv}")
    assert h.prob.tolist() == [0.25, 0.75]
    docs = sample_documents(1000, f"file:{csv}", np.random.default_rng(0))
    assert set(docs[:-1]) <= {10, *range(20, 30)}
    yml = tmp_path / "mine.yaml"
    yml.write_text("bins:\n  - {low: 5, high: 5, weight: 2}\n")
    assert set(sample_documents(100, f"file:{yml}", np.random.default_rng(0))) == {5}


@pytest.mark.parametrize(
    "text,needle",
    [
        ("low,high,weight\n0,10,1\n", "1 <= low <= high"),
        ("1,10\n", "low,high,weight"),
        ("1,10,-1\n", "weights must be >= 0"),
    ],
)
def test_bad_user_histograms_are_explained(tmp_path, text, needle):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(ValueError, match=needle):
        dist.load_histogram(f"file:{f}")


def test_missing_file_and_unknown_name():
    with pytest.raises(FileNotFoundError, match="not found"):
        dist.load_histogram("file:/nonexistent/x.csv")
    with pytest.raises(ValueError, match=r"allowed: \['auto', 'uniform', 'pile'"):
        dist.resolve("wiki", 100)
