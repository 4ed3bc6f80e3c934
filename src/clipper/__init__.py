"""clipper-serve."""
