"""Tests of the vignettes (vignettes/, shipped as moestat.vignettes)."""
