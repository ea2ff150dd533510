"""A catalog's [limits] (and a suite's or benchmark's own `limits`): it may lower the farm's job
limits ([farm] job_pids_max, job_memory_max, job_cpu_weight), never raise them; a value above
the farm's is a catalog error naming the key, at the nightly's load of the project."""

from __future__ import annotations

from pathlib import Path

import pytest

from gearfarm.config import Config, FarmConfig, ProjectConfig
from gearfarm.formats import catalog as catalog_mod
from gearfarm.run import nightly
from tests.projects import _init

CATALOG = """schema = 2

[limits]
memory = "1 GiB"
processes = 500

[build]
argv = ["true"]
outputs = ["."]

[suites.small]
argv = ["true"]
format = "exit-code"
limits = { processes = 20, cpu_weight = 10 }

[benchmarks.b]
argv = ["true"]
metrics = { t = "lower" }
metrics_pattern = "t=(?P<t>[0-9]+)"

[targets.linux-x86_64]
suites = ["small"]
"""


def test_a_steps_own_limits_lower_the_catalogs_which_lower_the_farms() -> None:
    cat = catalog_mod.parse(CATALOG, "catalog.toml")
    assert catalog_mod.limits_for(cat, cat.suite("small")) == {"memory": 1 << 30, "processes": 20, "cpu_weight": 10}
    assert catalog_mod.limits_for(cat, cat.benchmark("b")) == {"memory": 1 << 30, "processes": 500}
    assert catalog_mod.limits_for(cat, None) == {"memory": 1 << 30, "processes": 500}
    catalog_mod.check_limits(cat, "catalog.toml", FarmConfig().job_limits_max())  # all below the defaults


@pytest.mark.parametrize(("old", "new", "said"), [
    ('memory = "1 GiB"', 'memory = "16 GiB"',
     "[limits] memory = 16 GiB is above this farm's [farm] job_memory_max (8 GiB)"),
    ("processes = 20, cpu_weight = 10", "processes = 5000",
     "[suites.small.limits] processes = 5000 is above this farm's [farm] job_pids_max (4096)"),
    ('metrics_pattern = "t=(?P<t>[0-9]+)"', 'metrics_pattern = "t=(?P<t>[0-9]+)"\nlimits = { cpu_weight = 200 }',
     "[benchmarks.b.limits] cpu_weight = 200 is above this farm's [farm] job_cpu_weight (100)"),
])
def test_a_limit_above_the_farms_is_an_error_naming_the_key(old: str, new: str, said: str) -> None:
    cat = catalog_mod.parse(CATALOG.replace(old, new), "catalog.toml")
    with pytest.raises(catalog_mod.CatalogError) as e:
        catalog_mod.check_limits(cat, "catalog.toml", FarmConfig().job_limits_max())
    assert said in str(e.value) and "lower it or remove it" in str(e.value)


def test_a_limit_that_is_not_a_size_or_a_count_is_refused() -> None:
    for old, bad, key in (('memory = "1 GiB"', 'memory = "lots"', "limits.memory"),
                          ("processes = 500", "processes = 0", "limits.processes"),
                          ('memory = "1 GiB"', "memory = 12", "limits.memory")):
        with pytest.raises(catalog_mod.CatalogError, match=key.replace(".", r"\.")):
            catalog_mod.parse(CATALOG.replace(old, bad), "catalog.toml")


def test_the_nightly_refuses_a_catalog_that_raises_the_farms_limit(tmp_path: Path) -> None:
    repo = tmp_path / "greedy"
    repo.mkdir()
    _init(repo, {"jobs/catalog.toml": CATALOG.replace('memory = "1 GiB"', 'memory = "64 GiB"')})
    cfg = Config(farm=FarmConfig(state_dir=str(tmp_path / "state"), job_memory_max="16 GiB"))  # type: ignore[arg-type]
    # That project's night fails with the error (nightly.ProjectError); the others' go on.
    with pytest.raises(nightly.ProjectError, match=r"\[limits\] memory = 64 GiB is above this farm's \[farm\] "
                                                   r"job_memory_max \(16 GiB\)"):
        nightly.load_project(cfg, ProjectConfig(name="greedy", repo=str(repo)))
