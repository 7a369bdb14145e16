"""moestat's vignettes: runnable scripts (jupytext percent format) that reproduce the founding papers.

Installed as the package ``moestat.vignettes`` so that ``moestat vignette list`` finds them from a
checkout or a wheel.
"""
