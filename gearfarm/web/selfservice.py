"""Self-service runs: what a person may ask for from the dashboard (a project, any revision,
chosen targets, suites and benchmarks), checked here, and the one `gearfarm nightly` command
that runs it, as a process of its own against the farm's config. Names are checked against a
strict pattern before they reach a command line (a revision must not look like an option);
the nightly then checks them against the project's catalog at that revision and says what it
does not know, in the run's log. Each request gets a run id of its own (a random part beside
the time): a nightly given an id that exists resubmits that run, so two requests in the same
second sharing one would run the first one's revision twice."""

from __future__ import annotations

import re
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from gearfarm.config import Config, ConfigError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_REV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/^~-]{0,99}$")


class SubmitError(ValueError):
    """A self-service request that cannot be run, saying what to change."""


def _names(form: Mapping[str, Any], key: str) -> list[str] | None:
    """A list field: repeated form fields, a JSON list, or one comma-separated string; None
    when absent (the catalog's default), [] for an explicit 'none'."""
    raw: Any = form.getlist(key) if hasattr(form, "getlist") else form.get(key)
    if raw is None or raw == [] or raw == "":
        return None
    items = raw if isinstance(raw, list) else str(raw).split(",")
    names = [str(x).strip() for x in items if str(x).strip()]
    if "none" in names:  # the form's "none" box beside ticked names: the names win
        names = [n for n in names if n != "none"]
        if not names:
            return []
    for n in names:
        if not _NAME.match(n):
            raise SubmitError(f"{key}: {n!r} is not a name (letters, digits, '.', '_' or '-')")
    return names


def command(cfg: Config, form: Mapping[str, Any], who: str,
            taken: Callable[[str], bool] = lambda run_id: False) -> tuple[list[str], str]:
    """The nightly command for the request and the run id it will have: one no other run has
    (``taken`` says whether the farm knows an id already)."""
    if not cfg.source:
        raise SubmitError("this dashboard was not started from a config file; self-service runs need one")
    project = str(form.get("project") or cfg.project_list()[0].name)
    try:
        cfg.project(project)
    except ConfigError as e:
        raise SubmitError(str(e)) from None
    rev = str(form.get("rev") or "").strip() or cfg.project(project).branch
    if not _REV.match(rev):
        raise SubmitError(f"revision {rev!r}: give a branch, tag or commit (letters, digits and ._/^~-)")
    for _ in range(8):
        # 6 hex digits: two requests of one second collide once in 16 million; taken() catches that.
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}-{project}-by-{who}"
        if not taken(run_id):
            break
    else:
        raise SubmitError("no free run id after 8 tries (every one was taken); send the request again")
    argv = [sys.executable, "-m", "gearfarm.cli", "nightly", "--config", cfg.source, "--project", project,
            "--rev", rev, "--run-id", run_id]
    for key in ("targets", "suites", "benchmarks"):
        names = _names(form, key)
        if names is not None:
            if key == "targets" and not names:
                raise SubmitError("choose at least one target")
            argv += [f"--{key}", ",".join(names) or "none"]
    return argv, run_id
