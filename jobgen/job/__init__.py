"""The job spec: a recipe on a site resolved and checked, its sizes, health gate, plan."""
