"""The radixcache terminal inspector (Textual)."""
