"""Tests of moestat.deep."""
