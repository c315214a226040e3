"""The prediction cache: outputs kept by a hash of the inputs and of the version that computed them.

A node asks for one in its YAML (``cache: {max_mb: 64, ttl_s: 60}``); attach :func:`cache_hooks` to its
workers (``flowserve worker`` does). The gateway keeps one per topology with :class:`PredictionCache`.
"""

from flowserve.cache.hooks import CacheAnswer, CacheHooks, cache_hooks
from flowserve.cache.store import NodeCache, PredictionCache, tensor_key, version_digest

__all__ = ["CacheAnswer", "CacheHooks", "NodeCache", "PredictionCache", "cache_hooks", "tensor_key",
           "version_digest"]
