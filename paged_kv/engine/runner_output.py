"""What a runner returns for a step: :class:`ModelRunnerOutput` (plain data, no torch needed).

Its home is apart from :mod:`~paged_kv.engine.runner` (which imports torch) so that the
:class:`~paged_kv.engine.timing_runner.TimingRunner` and the engine loop run where torch is absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ModelRunnerOutput"]


@dataclass
class ModelRunnerOutput:
    """What a step produced (vLLM's ``ModelRunnerOutput``, trimmed).

    Attributes:
        sampled_token_ids: per sequence id that sampled, its tokens (``num_samples`` of them for
            a fresh leader: one per sample, which fork from it).
        seconds: how long the step took (wall clock for the model, modelled for a timing model).
        logits: per sequence id that sampled, the logits it sampled from, ``[V]`` fp32 (empty
            for the timing model).
        failed: request id -> the error (type and message) that its part of the step raised; such
            a request has nothing in ``sampled_token_ids``, and the scheduler ends it with
            ``"error"`` while the rest of the step counts.  The readers of the blocks it was to
            write (:meth:`~paged_kv.scheduling.SchedulerOutput.readers_of`) are not run: they are in
            neither field, and the scheduler puts them back in the waiting queue.
    """

    sampled_token_ids: dict[int, list[int]]
    seconds: float
    logits: dict[int, object] = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
