"""A run's record: the runs submitted, what each ran with, its progress and restarts."""
