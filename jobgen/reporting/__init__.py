"""`jobgen report`: a run's own account, read from what the run already wrote (node logs,
events, metrics, TensorBoard files, the scheduler's accounting): where its node-hours went, its
effective utilisation, what its failures say about the cluster, and its curves."""
