"""Tests of moestat.rates."""
