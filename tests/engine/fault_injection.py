"""Fault injection shared by the engine's fault tests: one request's part of a step fails."""

from paged_kv.engine import runner as runner_module

BAD = 255   # a token only the failing request's own tokens hold


def fail_one_request(monkeypatch, model, where: str, request_id) -> None:
    """Make ``request_id``'s part of every step raise: in the sampler (``where="sampler"``), or in
    the model's forward pass over any batch that holds the token :data:`BAD` (``"kernel"``)."""
    if where == "sampler":
        real = runner_module.ModelRunner._sample

        def failing(self, logits, c):
            if c.request_id == request_id:
                raise RuntimeError("sampler failed")
            return real(self, logits, c)
        monkeypatch.setattr(runner_module.ModelRunner, "_sample", failing)
    else:
        real = type(model).forward

        def failing(self, input_ids, *args, **kw):
            if bool((input_ids == BAD).any()):
                raise RuntimeError("kernel failed")
            return real(self, input_ids, *args, **kw)
        monkeypatch.setattr(type(model), "forward", failing)
