"""Plumbing: errors, the one writer and reader, records, cache, own files, quoting."""
