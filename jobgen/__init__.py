"""jobgen: render model-training recipes into Slurm and AWS Batch multi-node jobs."""

__version__ = "0.1.0"
