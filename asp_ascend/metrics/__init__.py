"""Metric definitions shared by the planner, the simulator and real runs (DESIGN 5)."""
from .admission import admission_latency
from .bubbles import (combine_instance_splits, deferred_lags, instance_split, instance_split_entry,
                      iteration_lower_bounds, iteration_time_stats, lag_histogram, lower_bound_ratio, padding_bubble,
                      rollout_breakdown, sum_histograms, summarize, time_weighted_cv, trainer_breakdown)
from .timeline import Timeline, TimelineWriter

__all__ = ["Timeline", "TimelineWriter", "summarize", "padding_bubble", "iteration_time_stats",
           "time_weighted_cv", "lag_histogram", "iteration_lower_bounds", "lower_bound_ratio",
           "rollout_breakdown", "trainer_breakdown", "deferred_lags", "sum_histograms", "instance_split",
           "combine_instance_splits", "instance_split_entry", "admission_latency"]
