"""Plumbing: errors, the one writer and reader, records, own files, quoting."""
