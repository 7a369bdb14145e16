"""Tests of moestat.metrics."""
