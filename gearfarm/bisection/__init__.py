"""Finding the commit that broke a test or moved a figure: the search over a range (search),
the search of a group of failures of one range (grouped), the probe runs that judge each
revision on the farm (probing, failures for tests, benchmark for a benchmark), and after a
nightly what to bisect, grouped, and its text (driver)."""
