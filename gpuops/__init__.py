"""gpuops: a Kubernetes operator suite for GPU clusters."""

from prometheus_client import disable_created_metrics

__version__ = "0.1.0"

# Our counters and histograms export no `_created` series: one more series per labelled child that no dashboard
# or alert of ours reads (rate() handles resets without it). Set here, in the module every gpuops import runs
# first, so it holds before any metric exists, in the operator, the MIG agent and the tests alike.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
