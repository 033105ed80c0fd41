"""`jobgen plan`: throughput, time, cost and failure-aware goodput of a recipe at several node
counts, before a reservation is booked. Nothing here is imported by render, submit or check."""
