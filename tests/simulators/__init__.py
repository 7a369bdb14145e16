"""Tests of moestat.simulators."""
