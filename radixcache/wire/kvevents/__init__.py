"""The ecosystem's KV-event wire format (vLLM, SGLang), both ways.

- ``codec``: the payload, both encodings, validation and dialect detection;
- ``translate``: our tree events -> BlockStored/BlockRemoved (``serve --kv-events vllm``);
- ``pubsub``: our publisher, and ``KVEventsClient`` for anyone's publisher;
- ``merge``: live + replayed batches -> one seq-ordered stream, with its ``Health``;
- ``view``: blocks keyed by hash and held per (rank, tier); ``radix``: chains drawn as nodes;
- ``report``: the lines ``tree --kv-events`` prints.
"""

from radixcache.wire.kvevents.codec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Cleared,
    DecodedBatch,
    KVEventBatch,
    KVEventsError,
    Removed,
    Stored,
    WireEvent,
    decode_batch,
    decode_event,
    encode_payload,
)
from radixcache.wire.kvevents.merge import Health, MergeLimits, SeqMerger, Sync
from radixcache.wire.kvevents.pubsub import (
    END_SEQ,
    TOPIC,
    KVEventPublisher,
    KVEventsClient,
    KVStream,
)
from radixcache.wire.kvevents.radix import RadixRow, hash_label, radix_rows, tree_lines
from radixcache.wire.kvevents.translate import KVTranslator, chain_hash
from radixcache.wire.kvevents.view import Block, BlockView, Holder

__all__ = [
    "END_SEQ", "TOPIC", "AllBlocksCleared", "Block", "BlockRemoved", "BlockStored", "BlockView",
    "Cleared", "DecodedBatch", "Health", "Holder", "KVEventBatch", "KVEventPublisher",
    "KVEventsClient", "KVEventsError", "KVStream", "KVTranslator", "MergeLimits", "RadixRow",
    "Removed", "SeqMerger", "Stored", "Sync", "WireEvent", "chain_hash", "decode_batch",
    "decode_event", "encode_payload", "hash_label", "radix_rows", "tree_lines",
]
