"""What the nodes run: jobgen's container images and the payload snapshot."""
