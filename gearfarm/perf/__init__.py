"""Performance: a night's A/B pairs, the comparison of two samples, change-point detection over
the nights, and the analysis, plots and trends the report shows."""
