"""`llmgw top`'s arithmetic: rates and quantiles between two scrapes, as Prometheus computes them."""
from __future__ import annotations

import pytest

from llmgw.cli.metricsview import Scrape, quantile, rate


def hist(*counts: int) -> str:
    """Histogram t of model m: cumulative counts at le 0.1, 0.5, 1 and +Inf."""
    return "# TYPE t histogram\n" + "".join(
        f't_bucket{{model="m",le="{le}"}} {n}\n' for le, n in zip(("0.1", "0.5", "1.0", "+Inf"), counts, strict=True))


def scrape(at: float, text: str) -> Scrape:
    s = Scrape(at)
    s.add(text)
    return s


def test_quantiles_interpolate_within_the_bucket_of_the_observations_between_scrapes():
    before = scrape(0.0, hist(10, 10, 10, 10) + 't_count{model="m"} 10\n')
    after = scrape(2.0, hist(10, 20, 30, 30) + 't_count{model="m"} 30\n')
    # 20 new observations: 10 in (0.1, 0.5], 10 in (0.5, 1]; the median is the 10th: 0.5
    assert quantile(0.5, before, after, "t", "model") == {("m",): pytest.approx(0.5)}
    assert quantile(0.75, before, after, "t", "model") == {("m",): pytest.approx(0.75)}
    assert quantile(0.5, after, after, "t", "model") == {}   # nothing observed: no quantile


def test_a_counter_that_went_down_counts_from_zero():
    before = scrape(0.0, '# TYPE r counter\nr_total{code="200"} 50\nr_total{code="503"} 4\n')
    after = scrape(2.0, '# TYPE r counter\nr_total{code="200"} 6\nr_total{code="503"} 10\n')
    assert rate(before, after, "r_total", "code") == {("200",): 3.0, ("503",): 3.0}
    assert rate(before, after, "r_total", prefix={"code": "5"}) == {(): 3.0}
