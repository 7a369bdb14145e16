"""Metrics that respect MoE symmetries: Voronoi losses, matching, distances, identifiability."""
