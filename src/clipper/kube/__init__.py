"""Kubernetes: the manifests ``clipper k8s render`` writes and the replica Deployments the
``k8s://`` container manager creates."""
