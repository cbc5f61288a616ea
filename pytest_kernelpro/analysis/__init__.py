"""Profile -> Stage 1 -> tools -> guidance, for a user's kernel and for every candidate.

`core` holds the entry point (`analyze_report`, `profile_and_analyze`); `evaluator` wraps a
search evaluator so that each correct candidate is profiled like a user kernel;
`candidate` is the child program that profiles one candidate on the GPU.
"""

from pytest_kernelpro.analysis.core import (
    Analysis,
    RooflineFacts,
    analyze_report,
    profile_and_analyze,
    report_from_dict,
    requested_metrics,
)

__all__ = [
    "Analysis",
    "RooflineFacts",
    "analyze_report",
    "profile_and_analyze",
    "report_from_dict",
    "requested_metrics",
]
