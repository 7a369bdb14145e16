"""Tests of moestat.fit."""
