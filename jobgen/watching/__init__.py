"""`jobgen watch`: follow a running job through what it already writes, catch a diverging or
hung run, and act on it.

readers (the payloads' JSON events, TensorBoard event files, the per-node logs) -> one
`Observation` type -> detectors (`Alert`s) -> actions (requeue, stop, rollback, notify). Nothing
here is imported when rendering.
"""
