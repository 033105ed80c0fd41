"""Stand-in name only: llama_setup.example_folders looks for NxD's training utilities beside the
converter; the export never imports them (tests/test_export_llama.py)."""
