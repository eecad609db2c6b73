"""radixcache: a token-granular radix-tree KV cache engine."""

__version__ = "0.1.0"
