"""Tests against a real Kubernetes control plane (tests/support/control_plane.py)."""
