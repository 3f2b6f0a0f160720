"""The engine layer: serving loops over the real model, blocks and cache.  Today the live block
panel's loop (:class:`LiveRequests`, chapter 5); the serving engine of the later chapters grows
here, on the scheduling rules of :mod:`paged_kv.scheduling` and the batch step of
:mod:`paged_kv.storage.batch`.
"""

from .live import LiveRequests

__all__ = ["LiveRequests"]
