"""Bounds of the commands' numeric options: an absurd value (``--blocks 2**63``, ``--seconds
nan``) is a usage error, exit 2, before any work; never a pool allocation that cannot
succeed, a run that cannot end, or a value that silently means something else."""

MAX_BLOCKS = 1 << 22  # radixcache.wire.validate.MAX_NUM_BLOCKS: subscribers refuse larger pools
MAX_THREADS = 256
WEEK_S = 7 * 24 * 3600.0  # the longest run a --seconds option takes
