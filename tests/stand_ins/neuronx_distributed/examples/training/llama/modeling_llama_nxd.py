"""Stand-in name only: llama_setup.example_folders looks for NxD's model module beside the
converter; the export never imports it (tests/test_export_llama.py)."""
