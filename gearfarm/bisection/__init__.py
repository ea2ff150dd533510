"""Finding the commit that broke a test or moved a figure: the search over a range (search) and
the runs that probe each revision (driver)."""
