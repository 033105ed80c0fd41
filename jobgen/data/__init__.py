"""jobgen's own files, built into the package: recipes, templates, payloads, site profiles,
platforms and container build files (jobgen/plumbing/resources.py finds them; setup.cfg maps the
project's top-level folders here)."""
