"""Unit tests of the wire formats: the job catalog, the signed payload, the S3 key layout and
artifact packing. Each asserts what a farm operator relies on: bad input is refused, clearly."""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from gearfarm.formats import catalog
from gearfarm.formats.job import (
    Artifact,
    JobId,
    Payload,
    PayloadError,
    Source,
    function_name,
    make_payload,
    sign,
    unique_id,
    verify,
)
from gearfarm.formats.marker import Marker, read, sealed
from gearfarm.formats.seal import SealError, Signer, keyring, seal
from gearfarm.run.nightly import Plan
from gearfarm.s3 import artifact, keys

ROOT = Path(__file__).resolve().parents[2]
REV = "a" * 40
NEW, OLD, ATTACKER = Signer.generate(), Signer.generate(), Signer.generate()
# What a worker's [farm] nightly_keys hold during a rotation: the new key and the previous one.
KEYS = keyring([NEW.public_text, OLD.public_text])
SOURCE = Source("engine", REV, "5" * 64, "6" * 64)


def test_repo_catalog_defines_the_four_targets_and_their_suites() -> None:
    cat = catalog.load_file(ROOT / "jobs" / "catalog.toml")
    assert set(cat.targets) == {"linux-x86_64", "linux-i686", "linux-aarch64", "windows-x86_64"}
    assert cat.target("linux-aarch64").runner == ["qemu-aarch64"]
    assert cat.target("windows-x86_64").runner == ["wine"]
    assert [t for t, v in cat.targets.items() if v.perf] == ["linux-x86_64"]
    for t in cat.targets.values():
        assert "unit" in t.suites


def test_unknown_names_list_the_known_ones() -> None:
    cat = catalog.load_file(ROOT / "jobs" / "catalog.toml")
    with pytest.raises(catalog.CatalogError, match="known targets: linux-aarch64, linux-i686"):
        cat.target("plan9-mips")
    with pytest.raises(catalog.CatalogError, match="known suites: model, recovery, unit"):
        cat.suites_for("linux-x86_64", ["unit", "nosuch"])
    assert cat.suites_for("windows-x86_64", ["unit", "recovery"]) == ["unit"]


BASE = """
schema = 2
[build]
argv = ["make", "CC={cc}"]
outputs = ["x"]
[targets.linux-x86_64]
vars = { cc = "gcc" }
suites = ["unit"]
[suites.unit]
argv = ["{root}/t"]
"""


def test_catalog_rejects_unknown_placeholders_and_undefined_suites() -> None:
    assert catalog.parse(BASE, "t").suite("unit").argv == ["{root}/t"]
    with pytest.raises(catalog.CatalogError, match=r"t: \[suites.unit\] argv: unknown placeholder \{payload\}"):
        catalog.parse(BASE.replace('"{root}/t"', '"{payload}"'), "t")
    with pytest.raises(catalog.CatalogError, match="suites lists 'model', which"):
        catalog.parse(BASE.replace('suites = ["unit"]', 'suites = ["unit", "model"]'), "t")
    with pytest.raises(catalog.CatalogError, match="not <os>-<arch>"):
        catalog.parse(BASE.replace("targets.linux-x86_64", "targets.linux"), "t")
    with pytest.raises(catalog.CatalogError, match=r"\[suites.extra\] argv must not be empty"):
        catalog.parse(BASE + "\n[suites.extra]\nargv = []\n", "t")


@pytest.mark.parametrize("edit,message", [
    # An unknown key: the file, the section, the key, and the fix.
    (('timeout = 120', 'timout = 120'), r"cat.toml: \[suites.unit\] unknown key 'timout': remove it or check its "
                                        r"spelling"),
    # A var only some targets define.
    (('"{root}/t"', '"{root}/t", "{ldflags}"'), r"\[suites.unit\] argv: unknown placeholder \{ldflags\} .*targets "
                                                r"linux-x86_64 define no var 'ldflags'.*add it to the targets' vars"),
    (('"{root}/t"', '"{root"'), r"malformed placeholder"),
    # A shell script's own braces: the error says how to write them.
    (('"{root}/t"', '"sh", "-c", "for f in {root}/t*; do ${f}; done"'),
     r"unknown placeholder \{f\} .*braces are meant literally \(a shell's \$\{x\} in `sh -c`.*write them doubled: "
     r"\{\{ and \}\}"),
    (('"{root}/t"', '"--x={runner}"'), r"\{runner\} must be an argv item of its own"),
    (('format = "tap"', 'format = "xunit"'), r"\[suites.unit.format\] Input should be 'junit', 'tap', 'ctest' or "
                                             r"'exit-code'"),
    (('schema = 2', 'schema = 1'), r"schema 1 is no longer read: set `schema = 2`"),
    (('cwd = "."', 'cwd = "../up"'), r"cwd '../up' must be a relative path inside the job's tree"),
    (('[suites.unit]', '[benchmarks.b]\nargv = ["x"]\nmetrics = { ops = "higher" }\n[suites.unit]'),
     r"set exactly one of metrics_file .* or metrics_pattern"),
    (('[suites.unit]', '[benchmarks.b]\nargv = ["x"]\nmetrics_pattern = "(?P<metric>ops)=(?P<value>[0-9]+)"\n'
                       'metrics = { ops = "higher" }\nrepetitions = 30\nmax_repetitions = 20\nprecision = 0.01\n'
                       '[suites.unit]'),
     r"max_repetitions \(20\) is below repetitions \(30\): raise it, or lower repetitions"),
    (('[suites.unit]', '[benchmarks.b]\nargv = ["x"]\nmetrics_pattern = "(?P<metric>ops)=(?P<value>[0-9]+)"\n'
                       'metrics = { ops = "higher" }\nmax_repetitions = 20\n[suites.unit]'),
     r"max_repetitions only applies with precision .*: set precision, or drop max_repetitions"),
    (('format = "tap"', 'format = "tap"\nonly = ["--only"]'), r"only \['--only'\] must name the case with \{case\}"),
    (('"{root}/t"', '"{root}/t", "{case}"'), r"\{case\} is only known in a suite's `only` items"),
])
def test_catalog_errors_name_the_file_the_key_and_the_fix(edit: tuple[str, str], message: str) -> None:
    text = BASE.replace('argv = ["{root}/t"]', 'argv = ["{root}/t"]\ntimeout = 120\nformat = "tap"\ncwd = "."')
    assert edit[0] in text
    catalog.parse(text, "cat.toml")
    with pytest.raises(catalog.CatalogError, match=message):
        catalog.parse(text.replace(*edit), "cat.toml")


def test_expand_substitutes_whole_arguments_only() -> None:
    argv = catalog.expand(["{root}/gfe", "--seed", "{seed}"], {"root": "/tmp/b; rm -rf /", "seed": "7"})
    assert argv == ["/tmp/b; rm -rf //gfe", "--seed", "7"]  # one argv item, no shell
    # The runner is zero or more argv items of its own.
    assert catalog.expand(["{runner}", "t"], {}, ["qemu-aarch64", "-L", "/x"]) == ["qemu-aarch64", "-L", "/x", "t"]
    assert catalog.expand(["{runner}", "t"], {}, []) == ["t"]


def _payload(**kw: object) -> Payload:
    base: dict[str, object] = dict(kind="test", run_id="r1", project="engine", rev=REV, source_sha256="5" * 64,
                                   catalog_sha256="6" * 64, target="linux-x86_64", name="unit",
                                   artifact_key="artifacts/x", artifact_sha256="b" * 64, submitted_at=time.time(),
                                   deadline=time.time() + 3600)
    base.update(kw)
    return Payload(**base)  # type: ignore[arg-type]


def test_names_and_unique_ids() -> None:
    p = _payload()
    assert p.function == function_name("test", "linux-x86_64") == "test:linux-x86_64"
    assert p.job == JobId("r1", "linux-x86_64", "test-unit") == JobId.parse("r1:linux-x86_64:test-unit")
    assert p.job_id == str(p.job) == "r1:linux-x86_64:test-unit"
    for bad in ("r1:linux-x86_64", "r1:x:y:z", "r1:linux-x86_64:deploy", "r1:linux-x86_64:test-", ""):
        with pytest.raises(ValueError, match="job id"):
            JobId.parse(bad)
    assert p.unique == unique_id(p.job_id, 1) != unique_id(p.job_id, 2)
    assert len(unique_id("r" * 300, 99)) <= 64  # gearmand's limit


def _plan(**kw: object) -> Plan:
    t = "linux-x86_64"
    base: dict[str, object] = dict(run_id="r1", source=SOURCE, targets=[t], suites={t: ["unit"]},
                                   benchmarks={t: ["oltp"]}, seed=5, deadline=123.0)
    base.update(kw)
    return Plan(**base)  # type: ignore[arg-type]


def test_one_factory_makes_every_payload() -> None:
    plan = _plan(baselines={"linux-x86_64": Artifact("artifacts/old", "c" * 64, "d" * 40)})
    build = plan.payload(JobId("r1", "linux-x86_64", "build"))
    art = Artifact("artifacts/new", "e" * 64)
    perf = plan.payload(JobId("r1", "linux-x86_64", "perf-oltp"), artifact=art)
    test = plan.payload(JobId("r1", "linux-x86_64", "test-unit"), 3, art)
    # The dependents have the run's deadline and seed; only perf carries the baseline.
    assert (perf.deadline, perf.seed, perf.baseline) == (123.0, 5, build.baseline)
    # ... and what they build from: the project's snapshot and catalog, by sha256.
    assert test.source == perf.source == build.source == SOURCE
    assert test.baseline is None and test.attempt == 3 and test.artifact == art
    assert test.unique == JobId.parse(test.job_id).unique(3)
    with pytest.raises(ValueError, match="needs the artifact"):
        make_payload(JobId("r1", "linux-x86_64", "test-unit"), source=SOURCE, deadline=1.0)


def test_a_build_passes_the_cases_to_run_alone_to_its_tests_and_only_to_them() -> None:
    """A bisection's probe runs one case: its build payload carries it, its test job gets it, a
    perf job does not; the case reaches the suite as single argv items of its `only`."""
    plan = _plan(cases=["limits; rm -rf /"])
    art = Artifact("artifacts/new", "e" * 64)
    assert plan.payload(JobId("r1", "linux-x86_64", "build")).cases == ["limits; rm -rf /"]
    assert plan.payload(JobId("r1", "linux-x86_64", "test-unit"), artifact=art).cases == ["limits; rm -rf /"]
    assert plan.payload(JobId("r1", "linux-x86_64", "perf-oltp"), artifact=art).cases == []
    with pytest.raises(ValidationError, match="cases"):
        _payload(cases=["bad\nname"])
    cat = catalog.parse(BASE.replace('argv = ["{root}/t"]', 'argv = ["{root}/t"]\nonly = ["--only", "{case}"]'), "c")
    vals = catalog.values(cat, cat.target("linux-x86_64"), {"root": "/r"})
    hostile = "limits; rm -rf /"
    assert catalog.expand(cat.suite("unit").only, {**vals, "case": hostile}) == ["--only", hostile]


def test_signed_payload_roundtrip_and_rotation() -> None:
    p = _payload()
    assert verify(sign(p, NEW), KEYS, 3600) == p
    # During a rotation a worker accepts the previous key too.
    assert verify(sign(p, OLD), KEYS, 3600) == p


@pytest.mark.parametrize("mutate,message", [
    (lambda b: b.replace(b'"unit"', b'"model"'), "bad signature"),
    (lambda b: b"not json", "not JSON"),
    (lambda b: json.dumps({"payload": {}}).encode(), "not a signed envelope"),
    (lambda b: b.replace(b'"purpose":"payload"', b'"purpose":"result"'), "not a payload"),
    (lambda b: b"x" * 70000, "too large"),
])
def test_tampered_payloads_are_refused(mutate, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PayloadError, match=message):
        verify(mutate(sign(_payload(), NEW)), KEYS, 3600)


def test_unknown_key_replay_and_commands_are_refused() -> None:
    # A worker host's own key (or anyone's but the nightly's) cannot make a payload.
    with pytest.raises(PayloadError, match="not one this verifier trusts"):
        verify(sign(_payload(), ATTACKER), KEYS, 3600)
    # Nor can it pass its envelope off under the nightly's key id.
    env = json.loads(sign(_payload(), ATTACKER))
    env["kid"] = NEW.kid
    with pytest.raises(PayloadError, match="bad signature"):
        verify(json.dumps(env).encode(), KEYS, 3600)
    with pytest.raises(PayloadError, match="time window"):
        verify(sign(_payload(submitted_at=time.time() - 7200), NEW), KEYS, 3600)
    # A payload cannot smuggle a command: unknown fields fail validation even when signed.
    env = json.loads(sign(_payload(), NEW))
    env["body"]["command"] = "rm -rf /"
    with pytest.raises(PayloadError, match="invalid payload"):
        verify(seal("payload", env["body"], NEW), KEYS, 3600)
    with pytest.raises(PayloadError, match="needs name, artifact_key"):
        verify(sign(_payload(artifact_key=None), NEW), KEYS, 3600)


def test_a_marker_is_obeyed_only_as_the_nightly_signed_it_for_that_run_or_job() -> None:
    c = Marker("cancel", "r1", "linux-x86_64", "test-unit", "carol", 5.0)
    assert read(sealed(NEW, c), KEYS, c) == c
    assert c.key == keys.cancel("r1", "linux-x86_64", "test-unit")
    whole = Marker("cancel", "r1", who="carol", at=5.0)
    assert read(sealed(OLD, whole), KEYS, Marker("cancel", "r1")) == whole and whole.key == keys.cancel("r1")
    for data, message in ((json.dumps({"who": "x", "at": 1}).encode(), "not a signed envelope"),
                          (sealed(ATTACKER, c), "not one this verifier trusts"),
                          (sign(_payload(), NEW), "not a marker"),
                          (seal("marker", {"halt": {"run_id": "r1", "target": "linux-x86_64", "step": "test-unit"}},
                                NEW), "not a cancel marker")):
        with pytest.raises(SealError, match=message):
            read(data, KEYS, c)
    # A genuine marker is for the run and job it names, not for the key it was copied to.
    for at in (Marker("cancel", "r2", "linux-x86_64", "test-unit"), Marker("cancel", "r1", "linux-x86_64", "test-big"),
               Marker("cancel", "r1")):
        with pytest.raises(SealError, match="copied, not obeyed"):
            read(sealed(NEW, c), KEYS, at)


def test_s3_key_layout_refuses_unsafe_components() -> None:
    assert keys.artifact(REV, "linux-x86_64", "abc") == f"artifacts/{REV}/linux-x86_64/abc/artifact.tar.zst"
    assert keys.result("r1", "linux-x86_64", "test-unit", 2, "f" * 64) == \
        f"runs/r1/linux-x86_64/test-unit/results/2-{'f' * 16}.json"
    for bad in ("../x", "a/b", "", "..", "/abs"):
        with pytest.raises(ValueError, match="unsafe"):
            keys.job_file("r1", bad, "s", "log.txt")


def test_artifact_pack_unpack_verifies_every_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "gfe").write_bytes(b"\x7fELF binary")
    (out / "libgfe.a").write_bytes(b"!<arch>")
    man = artifact.pack(out, ["gfe", "libgfe.a"], {"rev": REV}, tmp_path / "a.tar.gz")
    got = artifact.unpack(tmp_path / "a.tar.gz", tmp_path / "x", man["archive_sha256"])
    assert got["files"]["gfe"]["sha256"] == man["files"]["gfe"]["sha256"]
    assert (tmp_path / "x" / "gfe").read_bytes() == b"\x7fELF binary"
    with pytest.raises(artifact.ArtifactError, match="expected"):
        artifact.unpack(tmp_path / "a.tar.gz", tmp_path / "y", "0" * 64)
    with pytest.raises(artifact.ArtifactError, match="missing"):
        artifact.pack(out, ["nosuch"], {}, tmp_path / "b.tar.gz")


def _evil_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> str:
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    from gearfarm.s3.store import sha256_file

    return sha256_file(path)


@pytest.mark.parametrize("name,linkname,kind", [
    ("../escape", "", tarfile.REGTYPE),
    ("/etc/evil", "", tarfile.REGTYPE),
    ("link", "/etc/passwd", tarfile.SYMTYPE),
    ("link", "../../outside", tarfile.SYMTYPE),
])
def test_unpack_refuses_paths_and_links_outside(tmp_path: Path, name: str, linkname: str, kind: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = 1 if kind == tarfile.REGTYPE else 0
    sha = _evil_tar(tmp_path / "e.tar.gz", info)
    with pytest.raises(artifact.ArtifactError, match="cannot be unpacked safely"):
        artifact.unpack(tmp_path / "e.tar.gz", tmp_path / "dest", sha)
    assert not (tmp_path / "escape").exists()


def test_the_documented_lab_config_is_valid() -> None:
    from gearfarm import config

    cfg = config.load(ROOT / "docs" / "farm.example.toml")
    assert cfg.gearman.addresses() == [("gearman1.lab", 4731), ("gearman2.lab", 4731)]
    assert cfg.database.url.startswith("postgresql")
    assert cfg.mail.security == "starttls"


def test_config_errors_name_the_file_and_the_problem(tmp_path: Path) -> None:
    from gearfarm import config

    with pytest.raises(config.ConfigError, match="not found"):
        config.load(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text('[gearman]\nservers = ["no-port"]\n')
    with pytest.raises(config.ConfigError, match="is not 'host:port'"):
        config.load(tmp_path / "bad.toml")
    (tmp_path / "typo.toml").write_text('[gearmn]\n')
    with pytest.raises(config.ConfigError, match="gearmn"):
        config.load(tmp_path / "typo.toml")


def test_a_relative_results_database_is_beside_the_config_not_in_the_working_directory(tmp_path: Path) -> None:
    # A lab config without [database] once left gearfarm.db in whatever folder the nightly ran in
    # (a checkout: it was committed by accident).
    from gearfarm import config

    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "farm.toml").write_text("[farm]\n")
    assert config.load(tmp_path / "lab" / "farm.toml").database.url == f"sqlite:///{tmp_path}/lab/gearfarm.db"
    (tmp_path / "lab" / "farm.toml").write_text('[database]\nurl = "sqlite:///db/results.db"\n')
    assert config.load(tmp_path / "lab" / "farm.toml").database.url == f"sqlite:///{tmp_path}/lab/db/results.db"
    (tmp_path / "lab" / "farm.toml").write_text('[database]\nurl = "sqlite:////var/lib/gearfarm/r.db"\n')
    assert config.load(tmp_path / "lab" / "farm.toml").database.url == "sqlite:////var/lib/gearfarm/r.db"


def test_the_documented_catalogs_are_valid() -> None:
    """docs/projects.md's LMDB example (kept as docs/catalogs/lmdb.toml, the file the example
    lab config names) and the engine's own catalog both load."""
    from gearfarm import config

    cfg = config.load(ROOT / "docs" / "farm.example.toml")
    lmdb = catalog.load_file(cfg.path(cfg.project("lmdb").catalog_file or ""))
    assert {"linux-x86_64", "linux-aarch64"} <= set(lmdb.targets)
    assert all(s.format == "exit-code" for s in lmdb.suites.values())
    doc = (ROOT / "docs" / "projects.md").read_text()
    assert lmdb.build.argv[0] in doc and all(f"[suites.{n}]" in doc for n in lmdb.suites)


def test_doubled_braces_reach_a_shell_script_as_single_ones() -> None:
    cat = catalog.parse(BASE.replace('"{root}/t"', '"sh", "-c", "for f in {root}/t*; do ${{f}}; done"'), "t")
    assert catalog.expand(cat.suite("unit").argv, {"root": "/j"}) == ["sh", "-c", "for f in /j/t*; do ${f}; done"]
