"""Speculative decoding, chapter 9: the acceptance rule (exact, pure), its exact enumeration;
the same rule over tensors for the engine is ``paged_kv.spec_decode.rejection_sampler`` (torch,
imported from its module)."""

from .enumeration import exact_output_distribution, speculative_distribution, target_distribution
from .sampling_rule import FLOAT_TOLERANCE, check_distribution, residual, rule_outcomes, speculative_sample, uniform_chooser

__all__ = ["FLOAT_TOLERANCE", "check_distribution", "exact_output_distribution", "residual", "rule_outcomes",
           "speculative_distribution", "speculative_sample", "target_distribution", "uniform_chooser"]
