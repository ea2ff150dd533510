"""The farm's tests, one folder per package of the layer order (docs/architecture.md,
"Packages"): tests/<package>/ tests that package, tests/farm/ the whole farm end to end.
Every folder is a package, so pytest imports each test module by its full dotted name
(tests.db.test_history) and two folders may hold modules of the same basename. The shared
helpers (conftest.py, farmkit.py, pg.py, ...) stay here, imported as tests.<name>."""
