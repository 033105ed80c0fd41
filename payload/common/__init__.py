"""Pieces shared by the node-side training programs under ``payload/``.

The programs run as plain scripts, so each one puts ``payload/`` on ``sys.path`` itself and
imports ``common.<module>``. Nothing here imports torch at module level, so the helpers stay usable
(and testable) before the heavy imports happen.
"""
